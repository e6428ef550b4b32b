"""Text in, text out: the model's own tokenizer and chat template, and streaming
detokenization that never splits a multi-byte UTF-8 character.

Loads a Hugging Face tokenizer directory with ``tokenizers`` (no transformers,
so a board-side install stays small) and renders the chat template with jinja2 in
a sandbox, the way transformers' ``apply_chat_template`` does (a template comes
with the model and is untrusted).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract.packages import import_runtime, install_line
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError, check_text
from edgeinfer.run.generation.detokenize import Detokenizer

Message = Mapping[str, Any]


class TextCodec:
    """A model's tokenizer, special tokens, chat template and default EOS ids."""

    def __init__(self, directory: str | Path):
        d = Path(directory)
        self.directory = d
        path = d / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"{d} has no tokenizer.json; decoder models need a fast (tokenizers) tokenizer")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise BackendUnavailableError("decoder models need the `tokenizers` package",
                                          install_line("edgeinfer[llm]"), kind="package_missing") from None

        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust parser's message names the problem
            raise ModelError(f"{path} is not a valid tokenizer.json: {str(e).splitlines()[0][:160]}") from None
        self.config = _json_or_empty(d / "tokenizer_config.json")
        self.chat_template = _chat_template(d, self.config)
        self.eos_token_ids = _eos_ids(d, self.config, self.tokenizer)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def longest_token(self) -> int:
        """Characters of the vocabulary's longest entry (bytes, for byte-level BPE): no token stands for more
        text, so a prompt cannot take fewer tokens than its length over this."""
        return max((len(t) for t in self.tokenizer.get_vocab(with_added_tokens=True)), default=1)

    # --- encoding ---------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Plain completion: the raw text with the tokenizer's own special-token rules."""
        if not isinstance(text, str):
            raise InputError(f"prompt must be text, got {type(text).__name__}")
        check_text(text, "the prompt")
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def encode_raw(self, text: str) -> list[int]:
        """``text`` alone: no special tokens added (a BOS), those written in it still parsed."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise InputError(
                f"the model in {self.directory} has no chat template; use a plain prompt (no --chat) "
                "or add a chat_template to its tokenizer_config.json"
            )
        check_messages(messages)
        try:
            return render_bounded(self.chat_template, messages=[dict(m) for m in messages],
                                  add_generation_prompt=add_generation_prompt, **self.special_tokens())
        except TemplateBudget as e:
            raise InputError(f"the chat template of {self.directory} {e.args[0]}",
                             "fix or remove the model's chat_template (tokenizer_config.json or "
                             "chat_template.jinja), or send fewer messages") from None
        except InputError:
            raise
        except Exception as e:
            raise InputError(f"the model's chat template failed: {type(e).__name__}: {e}") from None

    def encode_chat(self, messages: Sequence[Message], max_chars: int | None = None) -> list[int]:
        """``max_chars``: refuse a rendered prompt longer than this before tokenizing it (the template may
        add text of its own)."""
        text = self.render_chat(messages)
        if max_chars is not None and len(text) > max_chars:
            raise InputError(f"the chat template of {self.directory} renders these messages as {len(text)} "
                             f"characters, more than the context can hold ({max_chars})", "shorten the messages")
        return self.encode_raw(text)  # the rendered template already holds the special tokens as text

    def special_tokens(self) -> dict[str, str]:
        out = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            v = self.config.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            out[key] = v if isinstance(v, str) else ""
        return out

    # --- decoding ---------------------------------------------------------------------------
    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def stream(self) -> Detokenizer:
        return Detokenizer(self)

    def token_text(self, token_id: int) -> tuple[str, bytes]:
        """One token as text (special tokens spelled out) and as the exact bytes it stands for, which
        differ where a token holds part of a UTF-8 character: byte-level BPE vocabularies spell bytes with
        GPT-2's byte-to-unicode table, SentencePiece byte fallback as ``<0xHH>``."""
        text = self.tokenizer.decode([int(token_id)], skip_special_tokens=False)
        piece = self.tokenizer.id_to_token(int(token_id)) or ""
        if type(self.tokenizer.decoder).__name__ == "ByteLevel" and all(c in _UNICODE_TO_BYTE for c in piece):
            return text, bytes(_UNICODE_TO_BYTE[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return text, bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return text, text.encode("utf-8", "replace")


class VocabularyCodec(TextCodec):
    """The codec of a decoder file with no tokenizer.json next to it: tokenizing, detokenizing, the chat
    template and EOS ids from the :class:`~edgeinfer.contract.decoder.Vocabulary` its backend reads from the
    file (``Backend.read_vocabulary``). Pickled as (backend, file), re-read where it is unpickled (serve's
    request helpers)."""

    def __init__(self, vocabulary: Any, path: Path, backend: str):  # noqa: D107 - no tokenizer.json to read
        self.vocabulary, self.path, self.backend = vocabulary, Path(path), backend
        self.directory = self.path.parent
        self.tokenizer = None
        self.config = {}
        self.chat_template = vocabulary.chat_template or None
        self.eos_token_ids = tuple(vocabulary.eos_token_ids)
        self.vocab_size = int(vocabulary.vocab_size)

    def __reduce__(self) -> tuple:
        return vocabulary_codec, (self.path, self.backend)

    @functools.cached_property
    def longest_token(self) -> int:
        return max((len(self.vocabulary.token_bytes(i)) for i in range(self.vocab_size)), default=1)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"prompt must be text, got {type(text).__name__}")
        check_text(text, "the prompt")
        return self.vocabulary.encode(text, True)

    def encode_raw(self, text: str) -> list[int]:
        return self.vocabulary.encode(text, False)

    def special_tokens(self) -> dict[str, str]:
        return {k: self.vocabulary.special_tokens.get(k, "") for k in ("bos_token", "eos_token", "pad_token",
                                                                        "unk_token")}

    def decode(self, ids: Sequence[int]) -> str:
        return self.vocabulary.decode([int(i) for i in ids])

    def token_text(self, token_id: int) -> tuple[str, bytes]:
        raw = self.vocabulary.token_bytes(int(token_id))
        return raw.decode("utf-8", "replace"), raw


def vocabulary_codec(path: Path, backend: str) -> VocabularyCodec:
    """The codec of the decoder file ``path`` from the vocabulary ``backend`` reads in it."""
    from edgeinfer.contract import registry

    vocab = registry.get_backend(backend).read_vocabulary(path)
    if vocab is None:
        raise ModelError(f"backend {backend!r} reads no vocabulary from {path.name}")
    return VocabularyCodec(vocab, path, backend)


class TokenFacts:
    """What a decoding loop needs of a tokenizer when another process turns its tokens into text: the
    tokenizer's directory, vocabulary size and EOS ids, without the tokenizer itself (a Qwen vocabulary's keeps
    ~53 MiB resident, bench/tokenizer_memory.py). Serve's decoder workers load with it; their answers end at EOS
    and ``max_new_tokens`` here, their text and stop strings are the HTTP process's (docs/serve.md, "Workers and
    devices")."""

    def __init__(self, directory: str | Path, vocab_size: int, eos_token_ids: Sequence[int]):
        self.directory = Path(directory)
        self.vocab_size = int(vocab_size)
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)

    @classmethod
    def of(cls, codec: TextCodec) -> TokenFacts:
        return cls(codec.directory, codec.vocab_size, codec.eos_token_ids)

    def stream(self) -> NoText:
        return NoText()


class NoText:
    """The detokenizer of :class:`TokenFacts`: no text, so no stop string can be seen."""

    def push(self, token_id: int) -> str:
        return ""

    def flush(self) -> str:
        return ""


def spelled_logprob(codec: TextCodec, entry: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's entry for one sampled token (``choices[].logprobs.content[]``: token text, log-probability,
    bytes, top alternatives) from a decoding loop's entry of token ids (``id``, ``logprob``, ``top_logprobs``)."""

    def one(e: dict[str, Any]) -> dict[str, Any]:
        text, raw = codec.token_text(e["id"])
        return {"token": text, "logprob": e["logprob"], "bytes": list(raw)}

    return {**one(entry), "top_logprobs": [one(e) for e in entry["top_logprobs"]]}


def check_messages(messages: Any) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InputError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InputError(f"message {i} must be an object with string 'role' and 'content'")
        check_text(m["content"], f"message {i}")


def _json_or_empty(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{path} is not valid JSON ({e}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path} must hold a JSON object")
    return data


def _chat_template(d: Path, config: Mapping[str, Any]) -> str | None:
    jinja = d / "chat_template.jinja"  # transformers >= 4.50 saves the template beside the config
    if jinja.is_file():
        return jinja.read_text()
    tpl = config.get("chat_template")
    if isinstance(tpl, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, Mapping)}
        tpl = named.get("default")
    if tpl is not None and not isinstance(tpl, str):
        raise ModelError(f"{d / 'tokenizer_config.json'}: chat_template must be a string")
    return tpl or None


def _eos_ids(d: Path, config: Mapping[str, Any], tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = []
    gen = _json_or_empty(d / "generation_config.json")
    raw = gen.get("eos_token_id")
    for v in raw if isinstance(raw, list) else [raw]:
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            ids.append(v)
    if not ids:
        eos = config.get("eos_token")
        eos = eos.get("content") if isinstance(eos, Mapping) else eos
        tid = tokenizer.token_to_id(eos) if isinstance(eos, str) else None
        if tid is not None:
            ids.append(tid)
    return tuple(dict.fromkeys(ids))


def _byte_level_table() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` inverted (https://github.com/openai/gpt-2, src/encoder.py): printable
    bytes stand for themselves, the others for the code points from 256 on."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in keep}, 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_UNICODE_TO_BYTE = _byte_level_table()


# A chat template comes with the model and is untrusted: jinja2's sandbox keeps it from reaching Python
# objects (https://jinja.palletsprojects.com/en/3.1.x/sandbox/) but not from running for ever or filling
# memory. Compiling and rendering are bounded here: Python lines executed (template code and the jinja2 /
# filter code it calls), wall time, and the size of every value the operators, filters and calls build.
RENDER_STEPS = 2_000_000
RENDER_SECONDS = 10.0
RENDER_CHARS = 64 * 2**20  # the rendered prompt, and any one string or list built on the way
RENDER_BITS = 4096  # integers the template computes
RENDER_WIDTH = 100_000  # numeric arguments of filters and calls (widths, counts), %-format widths


class TemplateBudget(BaseException):
    """A template went past one of the bounds. A BaseException, so no ``except Exception`` in jinja2 or
    in a filter swallows it (the trace function that raises it is switched off by Python when it does)."""


def _too_big(value: Any) -> bool:
    if isinstance(value, (str, bytes, list, tuple, dict)):
        return len(value) > RENDER_CHARS
    return isinstance(value, int) and value.bit_length() > RENDER_BITS


def _checked(value: Any) -> Any:
    if _too_big(value):
        raise TemplateBudget(f"builds a value larger than {RENDER_CHARS} characters or {RENDER_BITS}-bit numbers")
    return value


def _check_binop(op: str, left: Any, right: Any) -> None:
    """Refuse, before computing it, an operation whose result would be too big."""
    sized = (str, bytes, list, tuple)
    if op == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
        if abs(left) > 1 and right > 0 and right * math.log2(abs(left)) > RENDER_BITS:
            raise TemplateBudget(f"computes {left!r} ** {right!r}, beyond {RENDER_BITS}-bit numbers")
    elif op == "*" and isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > RENDER_BITS:
            raise TemplateBudget(f"multiplies numbers beyond {RENDER_BITS} bits")
    elif op == "*" and (isinstance(left, sized) or isinstance(right, sized)):
        seq, n = (left, right) if isinstance(left, sized) else (right, left)
        if isinstance(n, int) and len(seq) * max(n, 0) > RENDER_CHARS:
            raise TemplateBudget(f"repeats a value {n} times, beyond {RENDER_CHARS} characters")
    elif op == "+" and isinstance(left, sized) and isinstance(right, sized):
        if len(left) + len(right) > RENDER_CHARS:
            raise TemplateBudget(f"builds a value larger than {RENDER_CHARS} characters")
    elif op == "%" and isinstance(left, str):
        _check_widths(left)


_WIDTHS = None


def _check_widths(fmt: str) -> None:
    """``%``- and ``str.format``-style widths and precisions (``%0999999999d``, ``{:>999999999}``)."""
    global _WIDTHS
    if _WIDTHS is None:
        import re

        _WIDTHS = re.compile(r"[%:][^%:{}a-zA-Z]*?(\d{6,})")
    for m in _WIDTHS.finditer(fmt):
        if int(m.group(1)) > RENDER_WIDTH:
            raise TemplateBudget(f"formats with a width of {m.group(1)}, beyond {RENDER_WIDTH}")


def _check_args(args: tuple, kwargs: dict) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > RENDER_WIDTH:
            raise TemplateBudget(f"passes {a} to a filter or call, beyond {RENDER_WIDTH}")


class _Steps:
    """A trace function (https://docs.python.org/3/library/sys.html#sys.settrace) counting the Python lines
    run in this thread, that ends the work past ``RENDER_STEPS`` lines or ``RENDER_SECONDS``."""

    def __init__(self) -> None:
        import time

        self.clock = time.monotonic
        self.deadline = self.clock() + RENDER_SECONDS
        self.steps = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        self.steps += 1
        if self.steps > RENDER_STEPS:
            raise TemplateBudget(f"did not finish within {RENDER_STEPS} steps (it loops without bound, or the "
                                 "messages are too many)")
        if not self.steps & 1023 and self.clock() > self.deadline:
            raise TemplateBudget(f"did not finish within {RENDER_SECONDS:g} s")
        return self

    def __enter__(self) -> _Steps:
        import sys

        self._previous = sys.gettrace()  # e.g. coverage's tracer, given back afterwards
        sys.settrace(self)
        return self

    def __exit__(self, *exc: object) -> None:
        import sys

        sys.settrace(self._previous)


def render_bounded(source: str, **context: Any) -> str:
    """``source`` rendered with ``context`` within the bounds above; TemplateBudget past one of them."""
    with _Steps():
        template = _compiled(source)
        parts, size = [], 0
        for part in template.generate(**context):
            size += len(part)
            if size > RENDER_CHARS:
                raise TemplateBudget(f"renders more than {RENDER_CHARS} characters")
            parts.append(part)
    return "".join(parts)


_TEMPLATES: dict[str, Any] = {}


def _environment() -> Any:
    sandbox = import_runtime("jinja2.sandbox", "edgeinfer[llm]", "rendering the model's chat template")
    ImmutableSandboxedEnvironment = sandbox.ImmutableSandboxedEnvironment  # noqa: N806 - the class, by its name

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["+", "*", "**", "%"])  # also keeps them from being folded at compile

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return _checked(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's
            _check_args(args, kwargs)
            fmt = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # "...".format: sandbox-wrapped
            if isinstance(fmt, str):
                _check_widths(fmt)
            return _checked(super().call(__context, __obj, *args, **kwargs))

    def raise_exception(message: str) -> None:
        raise InputError(f"the model's chat template refused the messages: {message}")

    def bounded(f: Any, widths: bool = False) -> Any:
        passes = getattr(f, "jinja_pass_arg", None)  # @pass_eval_context & co.: one argument before the value

        def filter_(*args: Any, **kwargs: Any) -> Any:
            value_at = 1 if passes is not None else 0
            _check_args(args[value_at + 1:], kwargs)
            if widths and isinstance(args[value_at], str):
                _check_widths(args[value_at])
            return _checked(f(*args, **kwargs))

        if passes is not None:
            filter_.jinja_pass_arg = passes  # type: ignore[attr-defined]
        return filter_

    env = Bounded(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    for name in ("center", "indent", "wordwrap", "truncate", "replace", "join", "format", "batch", "slice",
                 "tojson", "string", "list"):
        env.filters[name] = bounded(env.filters[name], widths=name == "format")
    env.globals["raise_exception"] = raise_exception
    return env


def _bounded_join(join: Any) -> Any:
    def concat(parts: Any) -> Any:
        return _checked(join(parts))

    return concat


def _compiled(source: str) -> Any:
    if source not in _TEMPLATES:
        from jinja2.exceptions import TemplateError

        try:
            template = _environment().from_string(source)
        except TemplateError as e:
            raise ModelError(f"the model's chat template does not parse: {e}") from None
        names = template.root_render_func.__globals__  # the compiled module's namespace: `~` is str_join there
        for name in ("str_join", "markup_join"):
            if name in names:
                names[name] = _bounded_join(names[name])
        _TEMPLATES[source] = template
    return _TEMPLATES[source]
