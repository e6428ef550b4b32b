"""edgeinfer plugin: Hugging Face transformers on torch CPU, fp32 — the decoders' golden reference."""

from edgeinfer.contract import hookimpl


@hookimpl
def register_backends(register):
    from .backend import TransformersBackend  # torch and transformers load on first use only

    register(TransformersBackend)
