"""edgeinfer plugin: the onnxruntime CPU backend (golden reference)."""

from edgeinfer import hookimpl

from .backend import OnnxRuntimeBackend


@hookimpl
def register_backends(register):
    register(OnnxRuntimeBackend)
