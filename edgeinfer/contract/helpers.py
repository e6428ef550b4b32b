"""Small chores every backend needs, done once here: the core uses them and plugins import them.

Light on purpose (no NumPy, ONNX or SDK import at module level): ``import edgeinfer`` loads it.
"""

from __future__ import annotations

import json
import posixpath
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


# --- paths a model's own files name ----------------------------------------------------------------------


def relative_path(rel: Any, what: str, where: str, fix: str) -> str:
    """``rel`` as a normalised relative POSIX path (no ``..``, not absolute), or an InputError that names
    ``what`` (the field that holds it), ``where`` (the directory it must stay in) and ``fix``."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel:
        raise InputError(f"{what} {rel!r} is not a relative path inside {where}; {fix}")
    if rel.startswith("/") or (len(rel) > 1 and rel[1] == ":"):
        raise InputError(f"{what} {rel!r} is an absolute path; only files inside {where} are read ({fix})")
    if ".." in rel.split("/"):
        raise InputError(f"{what} {rel!r} leads out of {where} ('..'); only files inside {where} are read ({fix})")
    norm = posixpath.normpath(rel)
    if norm in (".", ""):
        raise InputError(f"{what} {rel!r} names {where} itself, not a file in it; {fix}")
    return norm


def inside(root: Path, rel: Any, what: str, where: str | None = None, fix: str = "convert the model again") -> Path:
    """``root / rel`` for a path read from a file of ``root`` (a bundle's manifest, a backend's own artifact
    config such as genai_config.json's ``filename``), after checking that it is relative and still lies
    inside ``root`` once symlinks are resolved; else an InputError naming ``what``. Every path a backend
    reads from a model directory goes through here: a same-size edit passes the size check at load."""
    root = Path(root)
    where = where or str(root)
    path = root / relative_path(rel, what, where, fix)
    real_root, real = root.resolve(), path.resolve()
    if real != real_root and real_root not in real.parents:
        raise InputError(f"{what} {rel!r} points outside {where} (to {real}); only files inside {where} are read "
                         f"({fix})")
    return path


def check_weight_index(model_dir: Path) -> None:
    """The shard names of a Hugging Face ``*.index.json`` (``weight_map``) stay inside ``model_dir``:
    transformers joins them to the directory as they are
    (``transformers.utils.hub.get_checkpoint_shard_files``)."""
    for index in sorted(Path(model_dir).glob("*.index.json")):
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelError(f"{index} is not a valid weight index; copy or convert the model again") from None
        for name in names:
            inside(model_dir, name, f"{index.name} weight_map entry", fix="copy or convert the model again")


def row_block(k: int, block: int, smallest: int = 32) -> int:
    """The block a row of ``k`` weights is cut into: ``block``, halved while it does not divide ``k`` (as NNCF's
    ``group_size_fallback`` "adjust"), down to ``smallest``; else (or a ``block`` of 0 or -1: per channel) the
    whole row. The rule of the plugins that write int8 in blocks (openvino, ascend) and of the planner's
    ``quant.block_of``."""
    size = block
    while size > smallest and k % size:
        size //= 2
    return size if size > 0 and k % size == 0 and (size >= smallest or size == block) else k
