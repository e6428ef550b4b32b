"""A minimal third-party decoder plugin (see docs/writing-a-backend.md#7-a-minimal-decoder-backend)."""

from edgeinfer.contract import hookimpl


@hookimpl
def register_backends(register):
    from .backend import ExampleDecoderBackend  # torch and transformers load when a decoder opens, not here

    register(ExampleDecoderBackend)
