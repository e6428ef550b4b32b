"""edgeinfer.contract.pages: the resident pages of a read-only file mapping are dropped and read back intact; a
writable mapping, and files the path does not name, are left alone."""

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
