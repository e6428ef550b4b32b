"""Drop the resident pages of a model file a runtime has copied its weights out of (:func:`drop_mapped`), or
while it copies them (:func:`dropping`). For backend plugins whose runtime maps the weights file and repacks
what it reads into buffers of its own.

Such a runtime leaves the mapped file pages resident beside the repacked copy: the weights twice in the
process's RSS. OpenVINO maps ``openvino_model.bin`` (``ENABLE_MMAP``) and its CPU plugin repacks the weights at
the first inference (bench/decoder_footprint.py: a 0.32 GB fp16 IR held 0.30 GB of mapped pages next to 0.33 GB
of repacked weights); llama.cpp maps the GGUF and, on CPUs with its repacked kernels, copies Q4_0 weights into
interleaved buffers at load (plugins/llamacpp/README.md). ``madvise(MADV_DONTNEED)`` on a read-only file mapping
drops those pages; a later access re-reads them from the file (man 2 madvise: "private mappings ...
repopulating the memory contents from the up-to-date contents of the underlying mapped file"; a shared
mapping's pages stay in the page cache), so nothing is lost: what the runtime still reads from the mapping comes
back on use.

:func:`collapse_resident` puts the weights a runtime packed into its own memory on 2 MiB pages, once they are
loaded; :func:`read_whole` has the page cache hold a weights file a runtime computes from in 2 MiB folios, before
it is mapped. Linux only; elsewhere, and where a call fails, nothing changes. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

MADV_DONTNEED = 4


def drop_mapped(path: Path, suffix: str = "") -> int:
    """madvise(MADV_DONTNEED) every read-only mapping of the file ``path`` or, when ``path`` is a directory, of
    each file under it whose name ends with ``suffix``; the bytes of address range advised (0 where nothing
    was mapped or the system has no /proc/self/maps)."""
    if not sys.platform.startswith("linux"):
        return 0
    target = Path(path).resolve()
    if target.is_dir():
        root = str(target) + "/"

        def wanted(name: str) -> bool:
            return name.startswith(root) and name.endswith(suffix)
    else:
        def wanted(name: str) -> bool:
            return name == str(target)
    found = _maps()
    if found is None:
        return 0
    lines, libc = found
    dropped = 0
    for line in lines:
        f = line.split(maxsplit=5)
        # never a writable mapping: dropping its pages would lose what was written
        if len(f) < 6 or not wanted(f[5]) or "w" in f[1]:
            continue
        start, end = (int(x, 16) for x in f[0].split("-"))
        if libc.madvise(start, end - start, MADV_DONTNEED) == 0:
            dropped += end - start
    return dropped


def _maps() -> tuple[list[str], ctypes.CDLL] | None:
    """The lines of /proc/self/maps and libc with ``madvise`` declared; None without /proc."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lines, libc


@contextlib.contextmanager
def dropping(path: Path, suffix: str = "", every_s: float = 0.02) -> Iterator[None]:
    """:func:`drop_mapped` every ``every_s`` seconds while the block runs, and once after: the runtime repacks
    the weights from the mapped file, and the pages it has read are dropped as it goes instead of the whole
    file staying resident beside the repacked copy (they stay in the page cache: a page read again is a minor
    fault, not I/O). The block's own work must release the GIL (a runtime's C call does)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            drop_mapped(path, suffix)

    t = threading.Thread(target=loop, name="edgeinfer-drop-pages", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        drop_mapped(path, suffix)


MADV_COLLAPSE = 25  # Linux 6.1 (man 2 madvise)
HUGE_PAGE = 2 << 20  # x86-64 and arm64 with 4 KiB pages: a PMD maps 2 MiB
HUGE_PAGES_ENV = "EDGEINFER_HUGE_PAGES"  # "off" (or 0): leave the weights on the pages they were given


def read_whole(path: Path, chunk: int = 64 << 10) -> int:
    """Read the file ``path`` from start to end before a runtime maps it; the bytes read (0 where
    ``EDGEINFER_HUGE_PAGES`` is off or the file cannot be read).

    A runtime that computes straight from a mapped weights file (onnxruntime with edgeinfer's own ops) reads it
    through whatever pages the kernel cached it in. First touched through a mapping, a file is cached 4 KiB at a
    time; read sequentially, in folios that grow with each readahead up to 2 MiB (Linux 6.x, filesystems with
    large folios such as ext4 on this project's 6.18), which a mapping then maps whole. Small reads keep the
    first readahead windows small, so the folios reach 2 MiB sooner (a 128 MiB file: 112 MiB of it on 2 MiB
    pages after 64 KiB reads, 48 MiB after 8 MiB reads). The fp16 peer model, cold: 200 of its 375 MiB on 2 MiB
    pages, and `edgeinfer bench` 1.15× the tokens/s (docs/generation.md, "Weights on 2 MiB pages"). Cheap where
    the file is cached already (one copy), whose folios stay as they are."""
    if os.environ.get(HUGE_PAGES_ENV, "").lower() in ("0", "off"):
        return 0
    done = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(chunk)
        while n := os.readv(fd, [buf]):
            done += n
    finally:
        os.close(fd)
    return done


def collapse_resident() -> int:
    """madvise(MADV_COLLAPSE) every 2 MiB-aligned stretch of this process's private anonymous memory (the heap
    and anonymous mappings, where a runtime holds the weights it packed) that is wholly resident; the bytes now
    backed by huge pages (0 before Linux 6.1, off Linux, or where the kernel refused).

    A weight matrix read once per token through 4 KiB pages costs a TLB miss every 4 KiB; through 2 MiB pages
    one CPU core streams it faster (docs/generation.md, "Weights on 2 MiB pages"). Only stretches whose every page is
    already resident are collapsed (``mincore``), so the RSS does not grow: a sparse stretch would be filled
    up to 2 MiB. The copy runs in the kernel, synchronously: about a second per 200 MB on this project's
    machine, once, after the weights are loaded."""
    if not sys.platform.startswith("linux") or os.environ.get(HUGE_PAGES_ENV, "").lower() in ("0", "off"):
        return 0
    found = _maps()
    if found is None:
        return 0
    lines, libc = found
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    pages = HUGE_PAGE // 4096
    vec = ctypes.create_string_buffer(pages)
    collapsed = 0
    for line in lines:
        f = line.split(maxsplit=5)
        if f[1] != "rw-p" or (len(f) == 6 and f[5] != "[heap]"):  # private, writable, no file behind it
            continue
        start, end = (int(x, 16) for x in f[0].split("-"))
        first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        for at in range(first, last, HUGE_PAGE):  # none where no whole aligned 2 MiB fits
            if libc.mincore(at, HUGE_PAGE, vec) != 0 or not all(b & 1 for b in vec.raw):
                continue
            for _ in range(2):  # EAGAIN (11): a page was briefly locked or under writeback; once more
                if libc.madvise(at, HUGE_PAGE, MADV_COLLAPSE) == 0:
                    collapsed += HUGE_PAGE
                    break
                if ctypes.get_errno() == 22:  # EINVAL: the kernel has no MADV_COLLAPSE
                    return collapsed
                if ctypes.get_errno() != 11:
                    break
    return collapsed
