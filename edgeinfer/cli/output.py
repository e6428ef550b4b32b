"""Output helpers every command uses: JSON on stdout (nothing else), rich on a terminal."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import click

#: the line width off a terminal: wide enough that no table or line wraps (a log, a pipe, `grep` reads whole lines)
UNWRAPPED = 10_000


def console(stderr: bool = False) -> Any:
    """Rich at the terminal's width; off a terminal (a pipe, a file) lines and tables keep their natural width
    instead of wrapping at rich's default 80 columns, unless COLUMNS says a width."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if "COLUMNS" in os.environ or _isatty(stream) else UNWRAPPED
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:
        return False


def print_json(data: Any) -> None:
    click.echo(json.dumps(json_safe(data), indent=2, default=str, allow_nan=False))


def json_safe(data: Any) -> Any:
    """NaN / Inf → null: bare ``NaN`` is not JSON, and a script reading us would choke on it."""
    if isinstance(data, float):
        return data if data == data and data not in (float("inf"), float("-inf")) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON (stdout holds nothing else) or through ``render``."""
    if as_json:
        print_json(data)
    else:
        render(data)


