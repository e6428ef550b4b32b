"""edgeinfer plugin: Huawei Ascend NPUs through torch_npu / CANN (CPU path where no NPU exists).

Nothing heavy is imported here: torch, transformers and torch_npu are imported inside methods.
"""

from edgeinfer.contract import hookimpl


@hookimpl
def register_backends(register):
    from .backend import AscendBackend  # imported on first use, so CLI start-up stays light

    register(AscendBackend)
