"""edgeinfer.contract.pages: the resident pages of a read-only file mapping are dropped and read back intact; a
writable mapping, and files the path does not name, are left alone. Resident anonymous memory is put on huge
pages with its bytes and RSS unchanged; a sparse stretch is not filled."""

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


def anonymous(size: int, touch_every: int) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping of ``size`` bytes, every ``touch_every``-th byte written; and its address."""
    import ctypes

    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for at in range(0, size, touch_every):
        m[at] = (at // 4096) % 251 + 1
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


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
    assert after["Rss"] == before["Rss"]
    assert all(m[at] == (at // 4096) % 251 + 1 for at in range(0, 32 << 20, 4096))
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
