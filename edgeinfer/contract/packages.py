"""What this installation has of the Python packages a bundle needs, and the line that installs what it lacks.

A requirement is a distribution with optional extras, as pip writes it: ``edgeinfer[llm]``,
``edgeinfer-openvino[decoders]``, ``rknn-toolkit-lite2``. A bundle's manifest lists the requirements it runs with
(``requires``, written by deploy); ``verify`` checks them with :func:`missing`, and a backend that imports a
runtime package only when a bundle needs it does so through :func:`import_runtime`, so that its absence is exit
3, kind ``package_missing``, naming the line to install. Standard library only (``importlib.metadata``).
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata
from types import ModuleType

from edgeinfer.contract.helpers import first_line
from edgeinfer.contract.names import BUNDLED_PLUGINS
from edgeinfer.errors import BackendUnavailableError

CORE = "edgeinfer"
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"""\bextra\s*==\s*['"]([^'"]+)['"]""")


def canonical(name: str) -> str:
    """A distribution or extra name as PEP 503 compares them (``openvino_genai`` == ``OpenVINO-GenAI``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(requirement: str) -> tuple[str, tuple[str, ...]]:
    """(distribution, extras) of ``dist`` or ``dist[extra,...]`` (a version or marker after it is ignored)."""
    m = _REQUIREMENT.match(requirement)
    if m is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return m.group(1), tuple(e.strip() for e in (m.group(2) or "").split(",") if e.strip())


def missing(requirement: str) -> list[str]:
    """The distributions ``requirement`` needs that are not installed here: the distribution itself, or what its
    extras add (followed through extras that name other extras, as ``edgeinfer[llm]`` names ``edgeinfer[text]``).
    Presence only: versions and environment markers other than ``extra`` are not evaluated."""
    absent: list[str] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def walk(req: str) -> None:
        name, extras = parse(req)
        key = (canonical(name), tuple(sorted(canonical(e) for e in extras)))
        if key in seen:
            return
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            absent.append(name)
            return
        for line in dist.requires or []:
            spec, _, marker = line.partition(";")
            extra = _EXTRA_MARKER.search(marker)
            if extra and canonical(extra.group(1)) in key[1]:
                walk(spec)

    walk(requirement)
    return absent


def install_line(requirement: str) -> str:
    """The command that installs ``requirement``: the core and this repository's plugins from a clone (they are
    on no package index), anything else by its name."""
    name, extras = parse(requirement)
    spec = f"[{','.join(extras)}]" if extras else ""
    dist = canonical(name)
    if dist == CORE:
        return f"pip install '.{spec}' (in a clone of edgeinfer)"
    for plugin in BUNDLED_PLUGINS:
        if dist == f"{CORE}-{plugin}":
            return f"pip install './plugins/{plugin}{spec}' (in a clone of edgeinfer)"
    return f"pip install '{name}{spec}'"


def check(requirements: list[str]) -> list[dict[str, object]]:
    """Per requirement: whether this installation has it, what it lacks and the line that installs it."""
    out = []
    for req in requirements:
        absent = missing(req)
        out.append({"requirement": req, "installed": not absent, "missing": absent,
                    "install": install_line(req) if absent else ""})
    return out


def import_runtime(module: str, requirement: str, what: str) -> ModuleType:
    """``module``, imported for ``what`` ("running an OpenVINO decoder bundle"). Not installed: exit 3, kind
    ``package_missing``, naming the line that installs ``requirement``; installed but failing to import (a
    broken install, a missing shared library): exit 3, kind ``backend_unavailable``, with the reason."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise BackendUnavailableError(f"{what} needs the Python package {module.split('.')[0]!r}, which is "
                                          "not installed", f"install it: {install_line(requirement)}",
                                          kind="package_missing") from None
        failure: Exception = e
    except Exception as e:  # an ImportError, OSError or RuntimeError from the package's own import
        failure = e
    raise BackendUnavailableError(f"{what}: {module!r} is installed but fails to import: {first_line(failure, 200)}",
                                  f"reinstall it: {install_line(requirement)}") from None
