"""``--trust-remote-code``: the one option of every command that can load a model directory through a library."""

from __future__ import annotations

from typing import Any

import click

HELP = ("Let transformers (and the backend's exporter) import and run the Python files a model directory names "
        "in auto_map (config.json, tokenizer_config.json); without it such a model is refused. Only for code you "
        "have read and trust (docs/security.md).")


def trust_remote_code_option(f: Any) -> Any:
    return click.option("--trust-remote-code", "trust_remote_code", is_flag=True, help=HELP)(f)
