"""edgeinfer.files: output paths refused before work starts; temporaries removed by their owner or,
once the owner is gone, by a later run — never while the owner lives."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from edgeinfer import files
from edgeinfer.errors import InputError


@pytest.fixture
def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def live_pid():
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


def test_temp_dir_is_removed_when_interrupted(tmp_path):
    with pytest.raises(KeyboardInterrupt), files.temp_dir(tmp_path, "deploy") as d:
        (d / "big.bin").write_bytes(b"\0" * 4096)
        assert d.name.startswith(f".edgeinfer-deploy-{os.getpid()}-")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_temp_file_is_removed_when_interrupted_with_the_folder_it_made(tmp_path):
    final = tmp_path / "onnx" / "key" / "model.onnx"
    with pytest.raises(KeyboardInterrupt), files.temp_file(final, "export") as t:
        t.write_bytes(b"\0" * 4096)
        raise KeyboardInterrupt
    assert list((tmp_path / "onnx").iterdir()) == []


def test_temp_file_moved_into_place_stays(tmp_path):
    final = tmp_path / "k" / "model.onnx"
    with files.temp_file(final, "export") as t:
        t.write_bytes(b"x")
        t.replace(final)
    assert final.read_bytes() == b"x" and [p.name for p in final.parent.iterdir()] == ["model.onnx"]


def test_sweep_removes_dead_owners_keeps_live_ones_and_foreign_names(tmp_path, dead_pid, live_pid):
    now = int(time.time())
    dead = tmp_path / f".edgeinfer-deploy-{dead_pid}-{now}-aaaa"
    live = tmp_path / f".edgeinfer-deploy-{live_pid}-{now}-bbbb"
    mine = tmp_path / f".edgeinfer-deploy-{os.getpid()}-{now}-cccc"
    user = tmp_path / f"results.tmp{dead_pid}"  # a user's file that merely looks like a 0.x cache name
    for p in (dead, live, mine):
        p.mkdir()
    user.write_text("keep me")
    assert files.sweep(tmp_path) == [dead]
    assert live.exists() and mine.exists() and user.exists()


def test_sweep_in_the_cache_reads_older_names_too(tmp_path, dead_pid, live_pid):
    old_dead = tmp_path / f"0123abcd.tmp{dead_pid}"
    old_live = tmp_path / f"4567abcd.tmp{live_pid}"
    old_export = tmp_path / f".model.onnx.{dead_pid}.tmp"
    old_dead.mkdir(), old_live.mkdir()
    old_export.write_bytes(b"\0")
    assert sorted(files.sweep(tmp_path, cache=True)) == sorted([old_dead, old_export])
    assert old_live.exists()


def test_a_reused_pid_does_not_keep_a_temporary_alive(tmp_path, live_pid):
    # made "long ago" by a process with this pid; the process now holding the pid started later
    old = tmp_path / f".edgeinfer-deploy-{live_pid}-{int(time.time()) - 3600}-dddd"
    old.mkdir()
    if files._process_start(live_pid) is None:
        pytest.skip("no /proc here: pid reuse cannot be told apart")
    assert files.sweep(tmp_path) == [old]


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_output_paths_under_a_file_are_refused(tmp_path, kind):
    (tmp_path / "f").write_text("x")
    check = files.check_output_dir if kind == "dir" else files.check_output_file
    with pytest.raises(InputError, match="is a file"):
        check(tmp_path / "f" / "sub" / "out", "-o")
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_output_dir_that_is_a_file_and_plot_that_is_a_dir_are_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="existing file"):
        files.check_output_dir(tmp_path / "f", "--out")
    with pytest.raises(InputError, match="directory"):
        files.check_output_file(tmp_path, "--plot")
    with pytest.raises(InputError, match=".png"):
        files.check_output_file(tmp_path / "p.gif", "--plot", (".png",))
    files.check_output_file(tmp_path / "new" / "p.png", "--plot", (".png",))  # creatable: fine


@pytest.mark.parametrize("path", ["/proc/x.png", "/proc/self/fd/out.json", "/sys/kernel/x.json", "/dev/x.json",
                                  "/dev/null", "/dev/stdout"])
def test_output_files_on_kernel_interfaces_are_refused(path):
    from pathlib import Path

    with pytest.raises(InputError, match="--plot"):
        files.check_output_file(Path(path), "--plot")


def test_output_paths_in_dev_shm_and_through_links_to_storage_are_fine_links_into_proc_are_not(tmp_path):
    from pathlib import Path

    files.check_output_dir(Path("/dev/shm/edgeinfer-out"), "--out")
    (tmp_path / "to-tmp").symlink_to(tmp_path)
    files.check_output_file(tmp_path / "to-tmp" / "x.json", "--output")
    (tmp_path / "to-proc").symlink_to("/proc/self")
    with pytest.raises(InputError, match="under /proc"):
        files.check_output_dir(tmp_path / "to-proc" / "out", "--out")


# --- the same bytes once ------------------------------------------------------------------------------------


def test_link_duplicates_links_equal_large_files_only(tmp_path):
    big = os.urandom(2 << 20)
    for name in ("a/model.bin", "b/model.bin", "c/model.bin"):
        (tmp_path / name).parent.mkdir()
        (tmp_path / name).write_bytes(big)
    (tmp_path / "c/model.bin").write_bytes(big[:-1] + bytes([big[-1] ^ 1]))  # same size, other bytes
    (tmp_path / "a/small.json").write_text("{}" * 10)
    (tmp_path / "b/small.json").write_text("{}" * 10)

    assert files.link_duplicates(tmp_path) == 2 << 20
    ino = {n: (tmp_path / n).stat().st_ino for n in ("a/model.bin", "b/model.bin", "c/model.bin")}
    assert ino["a/model.bin"] == ino["b/model.bin"] != ino["c/model.bin"]
    assert (tmp_path / "b/model.bin").read_bytes() == big
    assert (tmp_path / "a/small.json").stat().st_nlink == 1  # under min_bytes: left alone
    assert not [p for p in tmp_path.rglob(".edgeinfer-*")]
    assert files.link_duplicates(tmp_path) == 0  # linked already


def test_copy_tree_keeps_links_within_the_tree(tmp_path):
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    (src / "one.bin").write_bytes(b"w" * 100)
    os.link(src / "one.bin", src / "x" / "two.bin")
    (src / "other.bin").write_bytes(b"w" * 100)

    files.copy_tree(src, tmp_path / "dst")
    dst = tmp_path / "dst"
    assert (dst / "one.bin").stat().st_ino == (dst / "x" / "two.bin").stat().st_ino
    assert (dst / "one.bin").stat().st_ino != (src / "one.bin").stat().st_ino  # a copy, not a link to src
    assert (dst / "other.bin").stat().st_nlink == 1
    assert (dst / "x" / "two.bin").read_bytes() == b"w" * 100


def test_without_hard_links_bundles_keep_their_copies(tmp_path, monkeypatch):
    """On a file system without hard links (FAT or exFAT on an SD card, some network shares) ``os.link`` fails:
    deploy goes on with one copy per file, as before, and loses nothing."""
    def no_links(src, dst, *a, **k):
        raise PermissionError(1, "Operation not permitted")

    big = os.urandom(2 << 20)
    for name in ("a.bin", "b.bin"):
        (tmp_path / "src" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "src" / name).write_bytes(big)
    os.link(tmp_path / "src" / "a.bin", tmp_path / "src" / "c.bin")
    monkeypatch.setattr(os, "link", no_links)

    assert files.link_duplicates(tmp_path / "src") == 0
    files.copy_tree(tmp_path / "src", tmp_path / "dst")
    assert [(tmp_path / "dst" / n).read_bytes() == big for n in ("a.bin", "b.bin", "c.bin")] == [True] * 3
    assert not [p for p in tmp_path.rglob(".edgeinfer-*")]
