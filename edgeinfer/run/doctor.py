"""What ``edgeinfer backends`` and ``edgeinfer doctor`` report: every backend with its probe, plugins that
failed to load, and environment checks (each a verdict, what was found, and the fix when it fails).

Backend problems come from each backend's own ``probe()``; these checks cover what every command
needs from the machine: a supported Python, a writable cache with room for conversions, and the
environment variables that change which plugins load.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgeinfer.contract.names import PLUGINS_EXAMPLE

MIN_PYTHON = (3, 10)
MIN_FREE_GIB = 2.0  # one converted LLM-sized bundle plus its temporaries; MiniLM needs ~0.1 GiB


@dataclass
class Check:
    name: str
    status: str  # "ok", "warn" or "fail"
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def python_check(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    found = ".".join(map(str, version))
    if tuple(version[:2]) >= MIN_PYTHON:
        return Check("python", "ok", f"{found} ({sys.executable})")
    need = ".".join(map(str, MIN_PYTHON))
    return Check("python", "fail", found, f"use Python {need} or newer (python3 -m venv with a newer interpreter)")


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def cache_checks(root: Path) -> list[Check]:
    """The conversion cache: writable (created when missing) and enough free disk."""
    override = "EDGEINFER_CACHE_DIR=/a/writable/dir"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
        writable = Check("cache writable", "ok", str(root))
    except OSError as e:
        writable = Check("cache writable", "fail", f"{root}: {e.strerror or e}",
                         f"make {root} writable, or set {override}")
    free = shutil.disk_usage(_existing_parent(root)).free / 2**30
    if free >= MIN_FREE_GIB:
        space = Check("cache free disk", "ok", f"{free:.1f} GiB free")
    else:
        space = Check("cache free disk", "warn", f"only {free:.1f} GiB free under {root}",
                      f"free space (`edgeinfer cache clear` drops cached conversions) or set {override}")
    return [writable, space]


def cache_bound_check() -> Check:
    """The conversions against ``$EDGEINFER_CACHE_MAX_GB`` (a bad value fails here before a conversion ends)."""
    from edgeinfer.contract import cache
    from edgeinfer.errors import InputError

    try:
        limit = cache.max_bytes()
    except InputError as e:
        return Check("cache bound", "fail", e.message, e.hint or "")
    held = cache.conversions_bytes() / 1e9
    if limit is None:
        return Check("cache bound", "ok", f"conversions {held:.1f} GB, no bound ({cache.MAX_ENV}=off)")
    return Check("cache bound", "ok", f"conversions {held:.1f} GB of {limit / 1e9:g} GB ({cache.MAX_ENV}; the least "
                                      "recently used go first)")


def plugins_check(environ: dict[str, str] = os.environ) -> Check:  # type: ignore[assignment]
    raw = environ.get("EDGEINFER_PLUGINS")
    if raw is None:
        return Check("EDGEINFER_PLUGINS", "ok", "not set: every installed plugin loads")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        return Check("EDGEINFER_PLUGINS", "warn", "set but empty: no plugin loads",
                     f"unset EDGEINFER_PLUGINS (or list the plugins to load, e.g. {PLUGINS_EXAMPLE})")
    return Check("EDGEINFER_PLUGINS", "warn", f"only these plugins load: {', '.join(names)}",
                 "unset EDGEINFER_PLUGINS to load every installed plugin")


def environment_checks() -> list[Check]:
    from edgeinfer.contract import cache

    return [python_check(), *cache_checks(cache.root()), cache_bound_check(), plugins_check()]


def _backend_row(reg: Any, name: str, probe: bool) -> dict[str, Any]:
    entry = reg.backend(name)
    row: dict[str, Any] = {"name": name, "plugin": entry.plugin.name, "distribution": entry.plugin.distribution,
                           "version": entry.plugin.version}
    if probe:
        row.update(reg.probe(name).to_json())
    return row


def _failed(info: Any) -> dict[str, Any]:
    from edgeinfer.contract.registry import repair_hint

    return {"plugin": info.name, "distribution": info.distribution, "version": info.version, "error": info.error,
            "fix": repair_hint(info)}


def backend_reports(probe: bool = True) -> dict[str, Any]:
    """Every backend with its plugin, version and probe; every plugin that failed to load."""
    from edgeinfer.contract import registry as plugins

    reg = plugins.registry()
    rows = [_backend_row(reg, name, probe) for name in sorted(reg.backends)]
    failed = [_failed(p) for p in reg.plugins.values() if p.error]
    return {"backends": rows, "failed_plugins": failed}


def board_report(board: str) -> dict[str, Any]:
    """:func:`doctor_report` for the one backend of ``board`` (a name or a profile path; BoardError when unknown):
    only that plugin's backend is imported and probed. ``usable`` names it when it imports and its probe finds
    a device; ``missing`` says what is wrong and the fix when no installed plugin provides it."""
    from edgeinfer.contract import registry as plugins
    from edgeinfer.planning.boards import get_board

    b = get_board(board)
    reg = plugins.registry()
    report: dict[str, Any] = {"board": b.name, "backend": b.backend, "backends": [], "failed_plugins": [],
                              "missing": None}
    if reg.backend(b.backend) is not None:
        report["backends"].append(_backend_row(reg, b.backend, probe=True))
    else:
        problem, fix = plugins.unavailable(b.backend)
        report["missing"] = {"message": problem, "fix": fix}
        info = reg.plugins.get(b.backend)
        if info is not None and info.error:
            report["failed_plugins"].append(_failed(info))
    report["environment"] = [c.to_json() for c in environment_checks()]
    report["usable"] = [r["name"] for r in report["backends"] if r.get("available")]
    return report


def doctor_report() -> dict[str, Any]:
    """:func:`backend_reports` plus the environment checks and the names of the usable backends."""
    report = backend_reports()
    report["environment"] = [c.to_json() for c in environment_checks()]
    report["usable"] = [b["name"] for b in report["backends"] if b.get("available")]
    return report
