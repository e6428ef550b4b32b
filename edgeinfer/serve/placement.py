"""``serve --devices``: what one entry means for a worker of a backend (through the backend
contract: :meth:`~edgeinfer.contract.Backend.placement` and ``check_device_entry``)."""

from __future__ import annotations

import re

from edgeinfer.contract.records import Placement
from edgeinfer.errors import InputError


def placement(backend: str, entry: str | None) -> Placement:
    """The environment, device and load options of the worker for ``--devices`` entry ``entry``: what
    the backend's :meth:`~edgeinfer.contract.Backend.placement` says (docs/writing-a-backend.md)."""
    if entry is None:
        return Placement()
    from edgeinfer.contract import registry

    return registry.get_backend(backend).placement(entry)


MAX_WORKERS = 64
_DEVICE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:]*|[0-9]+")


def check_devices(backends: list[str], entries: list[str]) -> None:
    """Refuse ``--devices`` entries no backend of the served bundles could mean (before any worker starts)."""
    if len(entries) > MAX_WORKERS:
        raise InputError(f"--devices lists {len(entries)} workers; at most {MAX_WORKERS}")
    from edgeinfer.contract import registry

    for backend in sorted(set(backends)):
        for e in entries:
            registry.get_backend(backend).check_device_entry(e)
            if not _DEVICE_NAME.fullmatch(e):
                raise InputError(f"--devices {e!r}: not a device name or index; use e.g. 0,1 or CPU,NPU or GPU.1")
