"""A minimal third-party edgeinfer plugin (see docs/writing-a-backend.md)."""

from pathlib import Path

from edgeinfer.contract import hookimpl

BOARD = Path(__file__).parent / "boards" / "example-cpu.yaml"  # package data (pyproject.toml)


@hookimpl
def register_backends(register):
    from .backend import ExampleBackend  # imported on first use, so CLI start-up stays light

    register(ExampleBackend)


@hookimpl
def register_boards(register):
    register(BOARD)
