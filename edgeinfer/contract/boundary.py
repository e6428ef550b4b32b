"""The plugin-call boundary: what a plugin's convert / open / infer / decoder calls raise, as the core reports it.

One rule for every call into a plugin (docs/writing-a-backend.md#errors): an
:class:`~edgeinfer.errors.EdgeInferError` the plugin raises on purpose keeps its class and exit code (a plugin
saying "bad input" stays exit 2); a Python module the plugin imports at use and cannot find is exit 3
``package_missing`` naming the module; anything else it raises is exit 3 ``plugin_failed``,
"backend X failed: ...", blaming the plugin, not the user's input and not the core.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import BackendError, BackendUnavailableError, EdgeInferError

T = TypeVar("T")

REPORT = "rerun with --debug for the plugin's traceback and report it to the plugin's authors"


def plugin_error(backend: str, what: str, e: BaseException) -> BaseException:
    """The exception the core raises for ``e``, raised by backend ``backend``'s plugin while doing ``what``
    ("open model.xml", "infer", "decoder prefill"): ``e`` itself when it is not the plugin's failure."""
    if isinstance(e, EdgeInferError) or not isinstance(e, Exception):  # on purpose; KeyboardInterrupt, exit
        return e
    name = backend or "?"
    if isinstance(e, ModuleNotFoundError):
        module = e.name or first_line(e)
        err: EdgeInferError = BackendUnavailableError(
            f"backend {name!r} failed: Python module {module!r} is not installed (needed to {what})",
            "install the package that provides it for this backend (see 'edgeinfer doctor')", kind="package_missing")
    elif isinstance(e, ImportError):
        err = BackendUnavailableError(f"backend {name!r} failed: an import failed while it tried to {what}: "
                                      f"{first_line(e)}", "see 'edgeinfer doctor'")
    else:
        err = BackendError(f"backend {name!r} failed: {type(e).__name__}: {first_line(e, 300)} (in {what})", REPORT)
    err.__cause__ = e
    return err


def plugin_call(backend: str, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a call into backend ``backend``'s plugin, with its failures as :func:`plugin_error`
    makes them."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raised = plugin_error(backend, what, e)
        if raised is e:
            raise
        raise raised from e
