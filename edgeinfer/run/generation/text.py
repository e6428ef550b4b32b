"""Text in, text out: the model's own tokenizer and chat template, and streaming
detokenization that never splits a multi-byte UTF-8 character.

Loads a Hugging Face tokenizer directory with ``tokenizers`` (no transformers,
so a board-side install stays small) and renders the chat template with jinja2 in
a sandbox, the way transformers' ``apply_chat_template`` does (a template comes
with the model and is untrusted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.errors import BackendUnavailableError, InputError, ModelError, check_text

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
            raise BackendUnavailableError(
                "decoder models need the `tokenizers` package",
                "pip install 'edgeinfer[llm]' (from a clone: pip install '.[llm]')"
            ) from None

        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust parser's message names the problem
            raise ModelError(f"{path} is not a valid tokenizer.json: {str(e).splitlines()[0][:160]}") from None
        self.config = _json_or_empty(d / "tokenizer_config.json")
        self.chat_template = _chat_template(d, self.config)
        self.eos_token_ids = _eos_ids(d, self.config, self.tokenizer)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    # --- encoding ---------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Plain completion: the raw text with the tokenizer's own special-token rules."""
        if not isinstance(text, str):
            raise InputError(f"prompt must be text, got {type(text).__name__}")
        check_text(text, "the prompt")
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise InputError(
                f"the model in {self.directory} has no chat template; use a plain prompt (no --chat) "
                "or add a chat_template to its tokenizer_config.json"
            )
        check_messages(messages)
        try:
            return _compiled(self.chat_template).render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens(),
            )
        except InputError:
            raise
        except Exception as e:
            raise InputError(f"the model's chat template failed: {type(e).__name__}: {e}") from None

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        # the rendered template already holds the special tokens as text
        return self.tokenizer.encode(self.render_chat(messages), add_special_tokens=False).ids

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


class Detokenizer:
    """Turns a growing list of token ids into text pieces.

    Decodes a short window of recent ids and emits only what is new, holding text
    back while it ends in U+FFFD (an incomplete UTF-8 sequence): the prefix/read
    offsets of Hugging Face text-generation-inference's ``decode_token``
    (https://github.com/huggingface/text-generation-inference).
    """

    def __init__(self, codec: TextCodec):
        self.codec = codec
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        prefix = self.codec.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.codec.decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """What is still held back when the sequence ends."""
        prefix = self.codec.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.codec.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :]


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
_TEMPLATES: dict[str, Any] = {}


def _compiled(source: str) -> Any:
    if source not in _TEMPLATES:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise InputError(f"the model's chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        try:
            _TEMPLATES[source] = env.from_string(source)
        except TemplateError as e:
            raise ModelError(f"the model's chat template does not parse: {e}") from None
    return _TEMPLATES[source]
