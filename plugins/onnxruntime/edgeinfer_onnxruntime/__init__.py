"""edgeinfer plugin: the onnxruntime CPU backend (golden reference)."""

from edgeinfer.contract import hookimpl


@hookimpl
def register_backends(register):
    from .backend import OnnxRuntimeBackend  # imported on first use, so CLI start-up stays light

    register(OnnxRuntimeBackend)
