"""Drop the resident pages of a decoder's IR weights once the CPU plugin has repacked them (:func:`drop_mapped`),
or while it does (:func:`dropping`).

OpenVINO maps ``openvino_model.bin`` (``ENABLE_MMAP``, default on) and the CPU plugin repacks the weights
into its own buffers at the first inference; the mapped file pages stay resident as well, a second copy of
the weights in the process's RSS (bench/decoder_footprint.py: a 0.32 GB fp16 IR held 0.30 GB of mapped
pages next to 0.33 GB of repacked weights). ``madvise(MADV_DONTNEED)`` on a read-only file mapping drops
those pages; a later access re-reads them from the file (man 2 madvise: "private mappings ... repopulating
the memory contents from the up-to-date contents of the underlying mapped file"), so nothing is lost.
Linux only; elsewhere, and where a call fails, it drops nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

MADV_DONTNEED = 4


def drop_mapped(directory: Path) -> int:
    """madvise(MADV_DONTNEED) every read-only mapping of a ``.bin`` file under ``directory``; the bytes of
    address range advised (0 where nothing was mapped or the system has no /proc/self/maps)."""
    if not sys.platform.startswith("linux"):
        return 0
    root = str(Path(directory).resolve()) + "/"
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for line in lines:
        f = line.split(maxsplit=5)
        # never a writable mapping: dropping its pages would lose what was written
        if len(f) < 6 or not f[5].startswith(root) or not f[5].endswith(".bin") or "w" in f[1]:
            continue
        start, end = (int(x, 16) for x in f[0].split("-"))
        if libc.madvise(start, end - start, MADV_DONTNEED) == 0:
            dropped += end - start
    return dropped


@contextlib.contextmanager
def dropping(directory: Path, every_s: float = 0.02) -> Iterator[None]:
    """:func:`drop_mapped` every ``every_s`` seconds while the block runs, and once after: the CPU plugin packs
    the weights from the mapped file, and the pages it has read are dropped as it goes instead of the whole
    file staying resident beside the packed copy (they stay in the page cache: a page read again is a minor
    fault, not I/O)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            drop_mapped(directory)

    t = threading.Thread(target=loop, name="edgeinfer-drop-pages", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        drop_mapped(directory)
