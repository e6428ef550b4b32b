"""edgeinfer plugin: Rockchip NPUs through RKNN.

On a PC, ``rknn-toolkit2`` converts ONNX to ``.rknn`` and runs its simulator; on a board
``rknn-toolkit-lite2`` (RKNNLite) runs the artifact on the NPU. Neither is imported here.
"""

from edgeinfer.contract import hookimpl


@hookimpl
def register_backends(register):
    from .backend import RknnBackend  # imported on first use, so CLI start-up stays light

    register(RknnBackend)
