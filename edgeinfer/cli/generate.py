"""``edgeinfer generate`` and ``edgeinfer chat``: decoder models from the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from edgeinfer.cli.trust import trust_remote_code_option
from edgeinfer.errors import InputError, check_text


def _options(**kw: Any) -> Any:
    from edgeinfer.contract.generation import GenerationOptions

    return GenerationOptions(**{k: v for k, v in kw.items() if v is not None})


def _load(model: Path, backend: str | None, device: str | None, ctx: int | None, trust_remote_code: bool,
          window: int | None = None, threads: int | None = None) -> Any:
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.model.kind import Kind, find
    from edgeinfer.run.loading import decoder_threads, load
    from edgeinfer.run.paged_decoder import window_option

    if not model.exists():
        raise InputError(f"model not found: {model}", kind="model_not_found")
    match found := find(model):
        case Kind.DECODER_DIR | Kind.DECODER_BUNDLE | Kind.DECODER_FILE:
            return load(model, backend=backend, device=device, ctx=ctx, trust_remote_code=trust_remote_code,
                        **window_option(model, found, window), **decoder_threads(model, found, backend, threads))
        case Kind.ENCODER_BUNDLE:
            Bundle.open(model)  # a damaged bundle says so first
            raise InputError(f"bundle {model} holds no decoder (language) model; use `edgeinfer run` for it")
    raise InputError(
        f"{model} is not a decoder (language) model directory (its config.json names no *ForCausalLM); "
        "use `edgeinfer run` for other models"
    )


THREADS_HELP = ("Decoders: CPU threads of the backend, for backends that take a threads option (default: the "
                "runtime's).")
WINDOW_HELP = ("Layer-paged decoder bundles: segments resident at load (default: the bundle's; 1..its segments, "
               "as far as the board's memory holds them per the plan).")


def sampling_options(f: Any) -> Any:
    for opt in reversed(
        [
            click.option("--max-new-tokens", type=int, default=128, show_default=True,
                         help="Tokens to generate at most."),
            click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy."),
            click.option("--top-k", type=int, help="Sample from the k most likely tokens."),
            click.option("--top-p", type=float, help="Sample from the smallest set with this probability mass."),
            click.option("--repetition-penalty", type=float, help="> 1 discourages repeating tokens."),
            click.option("--seed", type=int, help="Seed for sampling (same seed, same text)."),
            click.option("--stop", multiple=True, help="Stop before this text; repeatable."),
            click.option("--ctx", type=int, help="Context (KV cache positions) to load the model with."),
            click.option("--backend",
                         help="Backend to run on (default: the bundle's, or the transformers reference)."),
            click.option("--device", help="Device of the backend (CPU, NPU, ...)."),
            click.option("--window", type=int, help=WINDOW_HELP),
            click.option("--threads", type=int, help=THREADS_HELP),
            trust_remote_code_option,
        ]
    ):
        f = opt(f)
    return f


@click.command("generate")
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("text", metavar="[PROMPT]", required=False)
@click.option("--prompt", help="Text to continue (with --chat: the user's message); or PROMPT after MODEL, - for "
                                "standard input.")
@click.option("--chat", is_flag=True, help="Apply the model's chat template to the prompt as a user message.")
@sampling_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, token_ids, metrics) only.")
def generate_cmd(model: Path, text: str | None, prompt: str | None, chat: bool, max_new_tokens: int,
                 temperature: float, top_k: int | None, top_p: float | None, repetition_penalty: float | None,
                 seed: int | None, stop: tuple[str, ...], ctx: int | None, backend: str | None, device: str | None,
                 trust_remote_code: bool, as_json: bool, window: int | None = None,
                 threads: int | None = None) -> None:
    """Generate text with MODEL (a Hugging Face decoder directory, a decoder bundle, or a decoder file a backend
    runs as it is: .gguf, .rkllm) from PROMPT (or --prompt; - reads it from standard input).

    Text streams to stdout as it is produced; timing goes to stderr.
    """
    opts = _options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    repetition_penalty=repetition_penalty, seed=seed, stop=stop)
    prompt = _prompt(text, prompt)
    check_text(prompt, "--prompt")
    with _load(model, backend, device, ctx, trust_remote_code, window, threads) as session:
        _say_caveat(session)
        stream = session.stream(prompt, opts, chat=chat)
        try:
            for piece in stream:
                if not as_json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            stream.close()
            raise
        result = stream.result
        report = {"model": str(model), "backend": session.decoder.backend_name, "device": session.decoder.device,
                  "context": session.context, **result.to_json()}
        if session.decoder.caveat:
            report["notes"] = [session.decoder.caveat]
        paging = session.decoder.paging_stats()
        if paging is not None:  # a layer-paged decoder: its window and page-ins since load
            report["paging"] = paging
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        sys.stdout.write("\n")
        m = result.metrics
        click.echo(
            f"[{m.generated_tokens} tokens, {result.finish_reason}; TTFT {m.ttft_ms:.1f} ms, "
            f"decode {m.decode_tokens_per_s:.1f} tok/s, KV cache {m.kv_cache_bytes / 2**20:.1f} MiB]",
            err=True,
        )


def _prompt(text: str | None, option: str | None) -> str:
    """The prompt given once, as PROMPT or --prompt; ``-`` reads standard input."""
    if text is not None and option is not None:
        raise InputError("the prompt is given twice (PROMPT and --prompt); give it once")
    if text is None and option is None:
        raise InputError("no prompt: give some text after MODEL (or with --prompt; - reads standard input)")
    prompt = option if text is None else text
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt:
        raise InputError("the prompt is empty; give some text after MODEL or with --prompt")
    return prompt


@click.command("chat")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--system", help="A system message to start the conversation with.")
@sampling_options
def chat_cmd(model: Path, system: str | None, max_new_tokens: int, temperature: float, top_k: int | None,
             top_p: float | None, repetition_penalty: float | None, seed: int | None, stop: tuple[str, ...],
             ctx: int | None, backend: str | None, device: str | None, trust_remote_code: bool,
             window: int | None = None, threads: int | None = None) -> None:
    """Talk with MODEL in the terminal: history is kept, Ctrl-C stops the answer, Ctrl-D exits."""
    opts = _options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    repetition_penalty=repetition_penalty, seed=seed, stop=stop)
    history: list[dict[str, str]] = [{"role": "system", "content": check_text(system, "--system")}] if system else []
    with _load(model, backend, device, ctx, trust_remote_code, window, threads) as session:
        click.echo(f"chatting with {model} on {session.decoder.backend_name} (Ctrl-C stops an answer, "
                   "Ctrl-D exits)", err=True)
        _say_caveat(session)
        while True:
            try:
                text = check_text(input("> "), "the message read from stdin")
            except UnicodeDecodeError as e:  # a strict-UTF-8 stdin; a surrogateescape one reaches check_text
                byte = e.object[e.start]
                raise InputError(f"the message read from stdin is not valid UTF-8 text (byte 0x{byte:02x})",
                                 "give UTF-8 text") from None
            except EOFError:
                click.echo("", err=True)
                return
            except KeyboardInterrupt:
                click.echo("", err=True)
                continue
            if not text.strip():
                continue
            history.append({"role": "user", "content": text})
            answer = _answer(session, history, opts)
            if answer is None:
                history.pop()  # the question stays unanswered: don't keep it
            else:
                history.append({"role": "assistant", "content": answer})


def _say_caveat(session: Any) -> None:
    """The decoder's caveat (e.g. a CPU fallback: not for speed), once, on stderr: stdout is the text."""
    if session.decoder.caveat:
        click.echo(f"note: {session.decoder.caveat}", err=True)


def _answer(session: Any, history: list[dict[str, str]], opts: Any) -> str | None:
    try:
        stream = session.stream(history, opts, chat=True)
    except InputError as e:  # e.g. the history outgrew the context: say so and keep chatting
        click.echo(f"error: {e.one_line()}", err=True)
        return None
    try:
        for piece in stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        stream.close()
        sys.stdout.write("\n")
        click.echo("[stopped]", err=True)
        return None
    sys.stdout.write("\n")
    return stream.result.text
