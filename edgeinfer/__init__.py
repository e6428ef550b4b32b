"""edgeinfer: plan, convert, run and serve the same model on edge NPUs.

The public Python API::

    import edgeinfer
    edgeinfer.backends()                     # {name: Backend}
    session = edgeinfer.load("model.onnx", backend="onnxruntime")
    outputs = session.run({"x": x})
    edgeinfer.plan("Qwen/Qwen3-8B", "rk3588-16g", quant="w8a8", ctx=4096)

Importing this package never imports torch, onnxruntime, OpenVINO or a vendor SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeinfer import telemetry as _telemetry
from edgeinfer.contract.hookspecs import hookimpl
from edgeinfer.version import __version__

_telemetry.off()  # before any library with telemetry is imported, here and in every worker process

if TYPE_CHECKING:
    from edgeinfer.contract.backend import Backend, Session

__all__ = ["__version__", "hookimpl", "backends", "backend", "load", "plan"]


def backends() -> dict[str, Backend]:
    """Every discovered backend, by name."""
    from edgeinfer.contract import registry as plugins

    return {name: plugins.get_backend(name) for name in plugins.backend_names()}


def backend(name: str) -> Backend:
    """The backend called ``name``; an error listing the known ones if there is none."""
    from edgeinfer.contract import registry as plugins

    return plugins.get_backend(name)


def load(path: Any, backend: str | None = None, device: str | None = None, *, trust_remote_code: bool = False,
         **options: Any) -> Session:
    """Load ``path`` on ``backend`` (default: the one whose native format it is).

    A model that is not the backend's native format (an ``.onnx`` given to the
    OpenVINO backend) is converted with the backend's default scheme first; the
    result is cached, keyed by file hash, backend, its versions and options.
    A Hugging Face directory that names Python code of its own (``auto_map``) is refused unless
    ``trust_remote_code=True`` (docs/security.md).
    """
    from edgeinfer.run.loading import load as _load

    return _load(path, backend=backend, device=device, trust_remote_code=trust_remote_code, **options)


def plan(model: Any, board: Any, **options: Any) -> Any:
    """Memory budget and speed estimate of ``model`` on ``board``; see :mod:`edgeinfer.planning.planner`."""
    from edgeinfer.planning.planner import plan as _plan

    return _plan(model, board, **options)
