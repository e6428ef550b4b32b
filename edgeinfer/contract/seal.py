"""Sealed directories: paths that stay inside, and files recorded with their size and sha256.

A bundle's manifest (and a cache entry's seal) names files by relative POSIX paths. A path is
accepted only when it is relative, has no ``..`` component and still lies inside the directory
once symlinks are resolved. Runtime logs (``*.log``) are not recorded. Each file is recorded as
``{"size": bytes, "sha256": hex}``; checking
the size is cheap (one ``stat``), the hash reads the whole file (see bench/bundle_hashing.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgeinfer.contract.helpers import inside, relative_path
from edgeinfer.contract.stamp import sha256_file
from edgeinfer.errors import InputError

DEPLOY_AGAIN = "deploy the model again"
FileRecord = dict[str, Any]  # {"size": int, "sha256": str}
# runtime logs a backend appends to next to its artifact while it runs (e.g. RKNN's model.rknn.log):
# never loaded as a model, so not sealed
UNSEALED_SUFFIXES = (".log",)


def sealed_name(rel: str) -> bool:
    return not rel.endswith(UNSEALED_SUFFIXES)


def relative(rel: Any, field: str) -> str:
    """``rel`` as a normalised relative POSIX path, or InputError naming ``field``."""
    return relative_path(rel, f"manifest {field}", "the bundle", DEPLOY_AGAIN)


def contained(root: Path, rel: Any, field: str) -> Path:
    """``root / rel`` after checking that it resolves inside ``root`` (symlinks followed)."""
    return inside(root, rel, f"manifest {field}", "the bundle", DEPLOY_AGAIN)


def record(directory: Path, skip: set[str] | frozenset[str] = frozenset()) -> dict[str, FileRecord]:
    """Size and sha256 of every regular file under ``directory`` (symlinks are not followed or recorded)."""
    out: dict[str, FileRecord] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(directory).as_posix()
            if rel in skip or not sealed_name(rel) or path.is_symlink() or not path.is_file():
                continue
            out[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return out


def entries(root: Path) -> Iterator[tuple[str, Path]]:
    """Every file and symlink under ``root`` as (relative POSIX path, path); symlinked directories are listed,
    not entered."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = Path(dirpath) / name
            yield path.relative_to(root).as_posix(), path


def outside_links(root: Path) -> list[str]:
    """The symlinks under ``root`` that resolve outside it (``"tokenizer/etc -> /etc"``): a runtime that opens
    a file through one reads what the bundle does not hold. A link loop counts as leading out."""
    real_root = root.resolve()
    out = []
    for rel, path in entries(root):
        if not path.is_symlink():
            continue
        try:
            real = path.resolve()
        except (OSError, RuntimeError):  # a loop
            real = None
        if real is None or (real != real_root and real_root not in real.parents):
            out.append(f"{rel} -> {os.readlink(path)}")
    return out


def refuse_outside_links(root: Path) -> None:
    """InputError when a symlink under ``root`` leads out of it (checked at every open of a bundle)."""
    links = outside_links(root)
    if links:
        more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
        raise InputError(f"bundle {root} holds a symlink that leads out of it: {links[0]}{more}; a bundle may only "
                         "hold its own files: remove the link, or deploy the model again", kind="bundle_damaged")


def unrecorded(root: Path, files: dict[str, FileRecord], skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Files and symlinks under ``root`` that ``files`` does not record (runtime logs and ``skip`` aside)."""
    return [rel + (" (symlink)" if path.is_symlink() else "") for rel, path in entries(root)
            if rel not in files and rel not in skip and sealed_name(rel)]


def check(root: Path, files: dict[str, FileRecord], full: bool) -> list[str]:
    """What is wrong with the recorded files under ``root``: one phrase per bad file, [] when all is well.

    Sizes are always compared; with ``full`` every file is hashed too.
    """
    problems = []
    for rel, rec in files.items():
        path = contained(root, rel, f"files[{rel!r}]")
        try:
            st = path.stat()
        except OSError:
            problems.append(f"{rel} is missing")
            continue
        if not path.is_file():
            problems.append(f"{rel} is not a file")
        elif st.st_size != rec["size"]:
            problems.append(f"{rel} has {st.st_size} bytes, the manifest recorded {rec['size']}")
        elif full and sha256_file(path) != rec["sha256"]:
            problems.append(f"{rel} has changed (sha256 differs from the manifest)")
    return problems


def verify(root: Path, files: dict[str, FileRecord], full: bool = False) -> None:
    """InputError (one line, kind ``bundle_damaged``) when a symlink under ``root`` leads out of it or a recorded
    file is missing or not as recorded (:func:`check`): what every open of a bundle checks."""
    refuse_outside_links(root)
    bad = check(root, files, full=full)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(f"bundle {root} is damaged: {bad[0]}{more}; run `edgeinfer verify {root}` for the list, "
                         "and deploy the model again", kind="bundle_damaged")


# --- sealed cache entries -----------------------------------------------------------------------------

SEAL = ".edgeinfer-seal.json"


def seal_dir(directory: Path) -> None:
    """Record every file of ``directory`` in its seal file (call when the directory is complete)."""
    import json

    (directory / SEAL).write_text(json.dumps(record(directory, skip={SEAL}), indent=1, sort_keys=True) + "\n")


def intact(directory: Path) -> bool:
    """Whether ``directory`` holds exactly the files its seal records, unchanged (every file hashed)."""
    import json

    try:
        recorded = json.loads((directory / SEAL).read_text())
        if not isinstance(recorded, dict):
            return False
        present = {rel for rel, _ in entries(directory) if sealed_name(rel)}
        if present - {SEAL} != set(recorded):
            return False
        return not check(directory, recorded, full=True)
    except (OSError, ValueError, TypeError, KeyError, InputError):
        return False
