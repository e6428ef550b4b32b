"""A minimal third-party edgeinfer plugin (see docs/writing-a-backend.md)."""

from edgeinfer import hookimpl

from .backend import ExampleBackend


@hookimpl
def register_backends(register):
    register(ExampleBackend)
