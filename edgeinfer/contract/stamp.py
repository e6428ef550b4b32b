"""Artifact stamps: a sidecar JSON next to every artifact a backend writes.

The stamp records who wrote the artifact, with which toolkit, for which target
and with which input specs, so that ``load`` can refuse an artifact it would
otherwise misread (a ``.rknn`` built by another toolkit version, an IR written
for another backend). A stamp is plain JSON; ``read`` checks the types of the
fields it relies on, so a malformed stamp is an input error, not a crash.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer import files
from edgeinfer.errors import InputError

if TYPE_CHECKING:
    from edgeinfer.contract.backend import Backend

FORMAT = 1


def stamp_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".stamp.json")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file; of a directory (a Hugging Face model), over its files' names and contents."""
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(f.relative_to(path).as_posix().encode() + b"\0" + sha256_file(f).encode())
        return h.hexdigest()
    return files.sha256_of(path, chunk)


def write(artifact: Path, *, backend: Backend, scheme: str, source: Path, **facts: Any) -> dict[str, Any]:
    from edgeinfer.version import __version__

    inputs = facts.pop("inputs", [])
    data = {
        "format": FORMAT,
        "backend": backend.name,
        "versions": {"edgeinfer": __version__, **backend.versions()},
        "target": facts.pop("target", ""),
        "scheme": scheme,
        "inputs": [s.to_json() if hasattr(s, "to_json") else s for s in inputs],
        "source": {"name": source.name, "sha256": sha256_file(source)},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **facts,
    }
    if "outputs" in data:  # TensorSpecs, as the inputs (a paged session wires segments from them)
        data["outputs"] = [s.to_json() if hasattr(s, "to_json") else s for s in data["outputs"]]
    stamp_path(artifact).write_text(json.dumps(data, indent=2) + "\n")
    return data


def read(artifact: Path) -> dict[str, Any] | None:
    p = stamp_path(artifact)
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"artifact stamp {p} is unreadable ({e}); re-create the artifact") from None
    if not isinstance(data, dict) or not isinstance(data.get("backend"), str):
        raise InputError(f"artifact stamp {p} is not an edgeinfer stamp; re-create the artifact")
    for key, kind in (("versions", dict), ("target", str), ("inputs", list)):
        if key in data and not isinstance(data[key], kind):
            raise InputError(f"artifact stamp {p}: {key!r} is not a {kind.__name__}; re-create the artifact")
    return data


def check(artifact: Path, *, backend: Backend, device: str | None) -> dict[str, Any] | None:
    """Refuse an artifact whose stamp says it was written for another backend or toolkit."""
    data = read(artifact)
    if data is None:
        return None
    if data["backend"] != backend.name:
        raise InputError(
            f"{artifact.name} was written by backend {data['backend']!r}, not {backend.name!r}; "
            f"load it with --backend {data['backend']}"
        )
    have = backend.versions().get("toolkit")
    made = data.get("versions", {}).get("toolkit")
    if have and made and have != made:
        reason = backend.refuses_toolkit(str(made), have)
        if reason:
            raise InputError(f"{artifact.name} {reason}")
    reason = backend.refuses_target(data.get("target", ""), device)
    if reason:
        raise InputError(f"{artifact.name}: {reason}")
    return data


def release(toolkit: str) -> tuple[int, ...] | None:
    """The numeric release in a toolkit string: ``"onnxruntime 1.26.0"`` → ``(1, 26, 0)``; None when it has none."""
    m = re.search(r"(\d+(?:\.\d+)*)", toolkit)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def refuses_newer(made: str, have: str) -> str | None:
    """``Backend.refuses_toolkit`` for a runtime whose releases load what earlier releases wrote: refuse only an
    artifact of a later release than the installed one (or one whose releases cannot be compared)."""
    m, h = release(made), release(have)
    if m is None or h is None:
        return f"was built with {made}, and this installation has {have}; install {made} or later"
    if m <= h:
        return None
    return (f"was built with {made}, newer than the installed {have}; upgrade to {made} or later, "
            "or convert the model again here")
