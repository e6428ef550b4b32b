"""Code from a model directory: never imported unless the user said so (``--trust-remote-code``).

A Hugging Face directory can name Python files of its own in an ``auto_map`` (config.json,
tokenizer_config.json, ...); transformers imports and runs them when a loader is called with
``trust_remote_code=True`` (https://huggingface.co/docs/transformers/custom_models), and
onnxruntime-genai's model builder passes ``hf_remote`` (default true) on as that argument. The rule,
in one place: a directory whose files name code is refused (one line, exit 2) unless the user trusts it;
every library call that can import model code passes :func:`allowed` as its ``trust_remote_code``.

The user's choice is per call of an entry point (``deploy(..., trust_remote_code=True)``, the CLI flag):
:func:`trusting` holds it for the calls below, in this thread; everywhere else it is False.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from edgeinfer.errors import InputError

FLAG = "--trust-remote-code"
# the files of a Hugging Face directory whose ``auto_map`` an Auto* class follows
NAMING_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json",
                "image_processor_config.json", "feature_extractor_config.json", "video_preprocessor_config.json")

F = TypeVar("F", bound=Callable[..., Any])

_TRUST: ContextVar[bool] = ContextVar("edgeinfer_trust_remote_code", default=False)
_said: list[str] = []  # the directory the one stderr notice of this process named


class RemoteCodeRefused(InputError):
    """A model directory names Python code of its own and the user did not pass --trust-remote-code."""


def trusted() -> bool:
    """The user's choice for the current call: True only inside ``trusting(True)``."""
    return _TRUST.get()


@contextmanager
def trusting(trust: bool) -> Iterator[None]:
    """Hold the user's ``trust_remote_code`` choice for the calls made inside this block."""
    if not isinstance(trust, bool):
        raise InputError(f"trust_remote_code must be True or False, got {trust!r}")
    token = _TRUST.set(trust)
    try:
        yield
    finally:
        _TRUST.reset(token)


def entry_point(fn: F) -> F:
    """An API function taking a keyword ``trust_remote_code`` (default False): the calls it makes see that
    choice through :func:`trusted` (a nested entry point is given ``trust_remote_code=trusted()``)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with trusting(kwargs.get("trust_remote_code", False)):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def code_named(model_dir: str | os.PathLike[str]) -> str | None:
    """The first ``auto_map`` entry of ``model_dir`` that names Python code, as
    ``"config.json auto_map names AutoModelForCausalLM -> modeling_x.X"``; None when there is none.
    A file that is not JSON names nothing here (its own reader reports it)."""
    d = Path(model_dir)
    if not d.is_dir():
        return None
    for name in NAMING_FILES:
        entry = _first_entry(d / name)
        if entry:
            return f"{name} auto_map names {entry}"
    return None


def allowed(model_dir: str | os.PathLike[str]) -> bool:
    """What to pass as ``trust_remote_code`` / ``hf_remote`` when a library loads ``model_dir``: the user's
    choice. Raises :class:`RemoteCodeRefused` when the directory names code and the user did not trust it;
    says so on stderr, once per process, when trusted code may run."""
    trust = trusted()
    named = code_named(model_dir)
    if named and not trust:
        raise RemoteCodeRefused(f"model dir {model_dir}: {named} (code from the model directory); pass {FLAG} "
                                "to allow it")
    if named and not _said:
        _said.append(str(model_dir))
        print(f"warning: {FLAG}: model dir {model_dir}: {named}; that code is imported and run",
              file=sys.stderr, flush=True)
    return trust


def _first_entry(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    auto_map = data.get("auto_map") if isinstance(data, dict) else None
    if not auto_map:
        return None
    if not isinstance(auto_map, dict):  # an odd shape still asks a loader to import something
        return f"{_short(auto_map)}"
    for cls, target in auto_map.items():
        targets = [t for t in (target if isinstance(target, list) else [target]) if t]
        if targets:
            return f"{cls} -> {_short(targets[0])}"
    return None


def _short(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= 120 else text[:117] + "..."
