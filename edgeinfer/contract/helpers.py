"""Small chores every backend needs, done once here: the core uses them and plugins import them.

Light on purpose (no NumPy, ONNX or SDK import at module level): ``import edgeinfer`` loads it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgeinfer.errors import InputError, ModelError

if TYPE_CHECKING:
    from edgeinfer.contract.backend import OpTime


def first_line(e: BaseException, limit: int | None = None, skip: Callable[[str], bool] | None = None) -> str:
    """The first non-empty line of an exception's message (the exception's type when it has none),
    skipping lines for which ``skip`` is true, cut to ``limit`` characters."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not skip(ln)] if skip else lines
    text = (useful or lines or [type(e).__name__])[0]
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def check_options(options: Mapping[str, Any], known: Collection[str], what: str) -> None:
    """Raise an InputError naming the first of ``options`` not in ``known`` and what ``what`` accepts."""
    unknown = sorted(set(options) - set(known))
    if not unknown:
        return
    accepted = f"known: {', '.join(known)}" if known else "it takes no options"
    raise InputError(f"unknown option {unknown[0]!r} for {what}; {accepted}")


def check_device(device: str | None, accepted: Collection[str], backend: str) -> None:
    """Raise an InputError unless ``device`` (case-insensitive; None and "" mean the default) is one of
    ``accepted``: for runtimes with a fixed device list."""
    if device in (None, "") or device.lower() in {a.lower() for a in accepted}:
        return
    raise InputError(f"unknown device {device!r} for backend {backend!r}; use one of: {', '.join(accepted)} "
                     "(or omit --device)")


def package_version(dist: str, missing: str | None = None) -> str | None:
    """The installed version of distribution ``dist``, or ``missing`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return missing


def slowest_first(ops: Iterable[OpTime]) -> list[OpTime]:
    """Op times sorted as ``Session.op_times`` returns them: slowest first."""
    return sorted(ops, key=lambda o: o.time_ms, reverse=True)


def read_artifact_manifest(path: Path, filename: str, fmt: int, what: str) -> dict[str, Any] | None:
    """The JSON manifest ``filename`` of a backend's artifact directory ``path``, or None when ``path`` is not
    one; an unreadable manifest, or one of another ``format`` than ``fmt``, is a ModelError (convert again)."""
    f = Path(path) / filename
    if not f.is_file():
        return None
    try:
        manifest = json.loads(f.read_text())
    except (OSError, ValueError):
        raise ModelError(f"{f} is not readable JSON; convert the model again") from None
    if manifest.get("format") != fmt:
        raise ModelError(f"{Path(path).name} has {what} format {manifest.get('format')}, expected {fmt}; "
                         "convert again")
    return manifest
