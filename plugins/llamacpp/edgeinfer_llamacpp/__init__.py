"""edgeinfer plugin: decoders on llama.cpp through llama-cpp-python's low-level bindings."""

from edgeinfer.contract import hookimpl


@hookimpl
def register_backends(register):
    from .backend import LlamaCppBackend  # imported on first use, so CLI start-up stays light

    register(LlamaCppBackend)
