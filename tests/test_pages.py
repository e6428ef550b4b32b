"""edgeinfer.contract.pages: the resident pages of a read-only file mapping are dropped and read back intact; a
writable mapping, and files the path does not name, are left alone. Resident anonymous memory is put on huge
pages with its bytes and RSS unchanged; a sparse stretch is not filled. A file read whole before it is mapped is
mapped on 2 MiB pages where the kernel caches files in large folios."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest

from edgeinfer.contract import pages
from edgeinfer.testing.mapped import mapped_rss as resident

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps: Linux")

SIZE = 4 << 20


def mapped(path: Path, access: int) -> mmap.mmap:
    f = path.open("r+b" if access == mmap.ACCESS_WRITE else "rb")
    m = mmap.mmap(f.fileno(), 0, access=access)
    f.close()
    m[:: 4096]  # touch every page
    return m


@pytest.fixture
def weights(tmp_path) -> Path:
    p = tmp_path / "model" / "weights.bin"
    p.parent.mkdir()
    p.write_bytes(bytes(range(256)) * (SIZE // 256))
    return p


def test_a_read_only_mapping_is_dropped_and_reads_back_the_same(weights):
    m = mapped(weights, mmap.ACCESS_READ)
    assert resident(weights) >= SIZE // 2
    assert pages.drop_mapped(weights) >= SIZE
    assert resident(weights) < SIZE // 8
    assert m[:] == weights.read_bytes()
    m.close()


def test_a_directory_drops_only_the_files_ending_with_the_suffix(weights):
    other = weights.with_suffix(".gguf")
    other.write_bytes(weights.read_bytes())
    a, b = mapped(weights, mmap.ACCESS_READ), mapped(other, mmap.ACCESS_READ)
    pages.drop_mapped(weights.parent, ".bin")
    assert resident(weights) < SIZE // 8 and resident(other) >= SIZE // 2
    a.close(), b.close()


def test_a_writable_mapping_keeps_its_pages_and_what_was_written(weights):
    m = mapped(weights, mmap.ACCESS_WRITE)
    m[:5] = b"hello"
    assert pages.drop_mapped(weights) == 0
    assert resident(weights) >= SIZE // 2 and m[:5] == b"hello"
    m.close()


def test_dropping_drops_while_the_block_runs_and_after(weights):
    import time

    with pages.dropping(weights, every_s=0.01):
        m = mapped(weights, mmap.ACCESS_READ)
        time.sleep(0.1)
        assert resident(weights) < SIZE // 8
        m[:: 4096]
    assert resident(weights) < SIZE // 8
    m.close()


def _kernel_collapses() -> bool:
    """MADV_COLLAPSE needs Linux 6.1 and a kernel with transparent huge pages not set to "never"."""
    import platform

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    version = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    return version >= (6, 1) and thp.exists() and "[never]" not in thp.read_text()


collapses = pytest.mark.skipif(not _kernel_collapses(), reason="MADV_COLLAPSE: Linux >= 6.1 with THP not 'never'")


GUARD = 4096


def anonymous(size: int, touch_every: int) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping of ``size`` bytes at offset ``GUARD`` of ``m``, every ``touch_every``-th byte
    written; and its address. Its first and last page are made inaccessible, so that the kernel does not merge
    it with a neighbouring anonymous mapping into one /proc/self/smaps entry (whose Rss would count both)."""
    import ctypes

    m = mmap.mmap(-1, size + 2 * GUARD, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base, GUARD, 0) == 0 and libc.mprotect(base + GUARD + size, GUARD, 0) == 0
    for at in range(0, size, touch_every):
        m[GUARD + at] = (at // 4096) % 251 + 1
    return m, base + GUARD


def smaps_of(address: int) -> dict[str, int]:
    """Rss and AnonHugePages (bytes) of the mapping of this process that holds ``address``."""
    entry, out = False, {}
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            start, end = (int(x, 16) for x in head[0].split("-"))
            if entry:
                break
            entry = start <= address < end
        elif entry and head[0] in ("Rss:", "AnonHugePages:"):
            out[head[0][:-1]] = int(head[1]) * 1024
    return out


@collapses
def test_resident_anonymous_memory_is_put_on_huge_pages_and_keeps_its_bytes():
    m, address = anonymous(32 << 20, 4096)
    before = smaps_of(address)
    collapsed = pages.collapse_resident()
    after = smaps_of(address)
    assert collapsed >= 28 << 20  # at least 14 of the 2 MiB-aligned stretches inside 32 MiB
    assert after["AnonHugePages"] - before["AnonHugePages"] >= 28 << 20
    assert after["Rss"] == before["Rss"] == 32 << 20
    assert all(m[GUARD + at] == (at // 4096) % 251 + 1 for at in range(0, 32 << 20, 4096))
    m.close()


@collapses
def test_a_sparse_stretch_is_left_alone_so_the_rss_does_not_grow():
    m, address = anonymous(32 << 20, 8192)  # every other page never touched
    before = smaps_of(address)
    pages.collapse_resident()
    after = smaps_of(address)
    assert after["Rss"] == before["Rss"] == 16 << 20
    assert after["AnonHugePages"] == before["AnonHugePages"]
    m.close()


def test_huge_pages_off_collapses_nothing(monkeypatch):
    m, address = anonymous(32 << 20, 4096)
    monkeypatch.setenv(pages.HUGE_PAGES_ENV, "off")
    before = smaps_of(address)
    assert pages.collapse_resident() == 0
    assert smaps_of(address)["AnonHugePages"] == before["AnonHugePages"]
    m.close()


def _file_pmd_mapped(path: Path) -> int:
    """Bytes of ``path`` this process maps through 2 MiB page-table entries (/proc/self/smaps FilePmdMapped)."""
    total, ours = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isalnum() and "-" in line.split(" ", 1)[0] and ":" not in line.split(" ", 1)[0]:
            ours = line.rstrip().endswith(str(path))
        elif ours and line.startswith("FilePmdMapped:"):
            total += int(line.split()[1]) * 1024
    return total


def _cold_and_touched(path: Path, read_first: bool) -> int:
    """Drop ``path`` from the page cache, optionally :func:`pages.read_whole` it, map it and touch every page, last
    first; the bytes mapped on 2 MiB pages."""
    import os

    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if read_first:
        assert pages.read_whole(path) == path.stat().st_size
    with path.open("rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private and writable, as onnxruntime maps
    for at in range(len(m) - 4096, -1, -4096):  # out of order, as a graph's steps touch it (in order, the
        m[at]  # mapping's own readahead grows its folios too)
    try:
        return _file_pmd_mapped(path)
    finally:
        m.close()


def test_a_file_read_whole_before_it_is_mapped_is_mapped_on_2_mib_pages(tmp_path, monkeypatch):
    """The kernel caches a file read sequentially in large folios, and one first touched out of order through a
    mapping 4 KiB at a time (Linux 6.x, on filesystems with large folios: this project's ext4 on 6.18)."""
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * ((128 << 20) // 256))  # the readahead's folios grow over the first MiBs
    faulted = _cold_and_touched(path, read_first=False)
    read = _cold_and_touched(path, read_first=True)
    if read == 0:
        pytest.skip("this kernel or filesystem caches no file in 2 MiB folios")
    assert faulted == 0 and read >= 64 << 20
    monkeypatch.setenv(pages.HUGE_PAGES_ENV, "off")
    assert pages.read_whole(path) == 0
