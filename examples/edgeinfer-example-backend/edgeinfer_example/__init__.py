"""A minimal third-party edgeinfer plugin (see docs/writing-a-backend.md)."""

from edgeinfer.contract import hookimpl


@hookimpl
def register_backends(register):
    from .backend import ExampleBackend  # imported on first use, so CLI start-up stays light

    register(ExampleBackend)
