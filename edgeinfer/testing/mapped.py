"""What a test reads of the process's file mappings: the resident bytes of a weights file's mappings, counted
from /proc/self/smaps independently of :mod:`edgeinfer.contract.pages` (which drops them). Linux only."""

from __future__ import annotations

from pathlib import Path


def mapped_rss(path: Path, suffix: str = "") -> int:
    """Rss of this process's mappings of the file ``path`` or, for a directory, of the files under it whose
    names end with ``suffix``."""
    target = Path(path).resolve()
    root = str(target) + "/"
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        f = line.split()
        if f and not f[0].endswith(":"):  # a mapping's header: address range, perms, offset, dev, inode, path
            name = f[5] if len(f) > 5 else ""
            inside = name == str(target) or (name.startswith(root) and name.endswith(suffix))
        elif inside and f[0] == "Rss:":
            total += int(f[1]) * 1024
    return total
