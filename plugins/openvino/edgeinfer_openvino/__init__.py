"""edgeinfer plugin: OpenVINO IR on Intel Core Ultra NPU, Intel GPU and CPU.

openvino and nncf are imported inside methods, never at plugin import.
"""

from edgeinfer import hookimpl

from .backend import OpenVinoBackend, OpenVinoSession
from .devices import diagnose, fallback_warning, select_device

__all__ = ["OpenVinoBackend", "OpenVinoSession", "diagnose", "fallback_warning", "select_device"]


@hookimpl
def register_backends(register):
    register(OpenVinoBackend)
