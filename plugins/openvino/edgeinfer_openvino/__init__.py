"""edgeinfer plugin: OpenVINO IR on Intel Core Ultra NPU, Intel GPU and CPU.

openvino and nncf are imported inside methods, never at plugin import.
"""

from edgeinfer.contract import hookimpl


@hookimpl
def register_backends(register):
    from .backend import OpenVinoBackend  # imported on first use, so CLI start-up stays light

    register(OpenVinoBackend)
