"""``edgeinfer cache``: what each area of the cache takes on disk, and ``cache clear`` removing the conversions
(or the areas named) but never an entry a running process is building."""

from __future__ import annotations

import json
import os
import time

import pytest

from edgeinfer import files
from edgeinfer.contract import cache
from edgeinfer.testing.cli import run_cli

MIB = 1 << 20


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A cache with two deploy entries (a bundle and a reference export), a converted artifact, a test model and
    the host's bandwidth file. The bundle holds one MiB twice, hard-linked."""
    base = tmp_path / "cache"
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(base))
    bundle = base / "deploy" / "0123abcd"
    bundle.mkdir(parents=True)
    (bundle / "a.bin").write_bytes(os.urandom(MIB))
    os.link(bundle / "a.bin", bundle / "b.bin")
    (base / "deploy" / "onnx" / "fedc4321").mkdir(parents=True)
    (base / "deploy" / "onnx" / "fedc4321" / "model.onnx").write_bytes(b"x" * 5000)
    (base / "artifacts" / "onnxruntime" / "99aa").mkdir(parents=True)
    (base / "artifacts" / "onnxruntime" / "99aa" / "model.onnx").write_bytes(b"y" * 7000)
    (base / "test-llm" / "qwen3-random").mkdir(parents=True)
    (base / "test-llm" / "qwen3-random" / "model.safetensors").write_bytes(b"z" * 3000)
    (base / "host").mkdir()
    (base / "host" / "bandwidth-1.json").write_text("{}")
    return base


def listing(capfd) -> dict:
    r = run_cli(capfd, "cache", "--json")
    assert r.returncode == 0, r.stderr
    return {a["area"]: a for a in json.loads(r.stdout)["areas"]}


def test_cache_lists_each_area_with_its_entries_and_a_hard_linked_file_once(root, capfd):
    areas = listing(capfd)
    assert set(areas) == {"deploy", "artifacts", "test-llm", "host"}
    assert {n: a["entries"] for n, a in areas.items()} == {"deploy": 2, "artifacts": 1, "test-llm": 1, "host": 1}
    assert MIB <= areas["deploy"]["bytes"] < 1.5 * MIB  # two names, one file: counted once
    assert [n for n, a in areas.items() if a["rebuilt"]] == ["artifacts", "deploy"]
    r = run_cli(capfd, "cache")
    assert r.returncode == 0 and str(root) in r.stdout and "only by name" in r.stdout


def test_clear_removes_the_conversions_and_keeps_what_is_not_rebuilt(root, capfd):
    r = run_cli(capfd, "cache", "clear", "--dry-run", "--json")
    assert json.loads(r.stdout)["removed_entries"] == 3 and (root / "deploy" / "0123abcd").is_dir()
    r = run_cli(capfd, "cache", "clear", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["removed_entries"] == 3 and out["freed_bytes"] >= MIB and out["busy"] == []
    assert not (root / "deploy" / "onnx").exists() and not (root / "artifacts" / "onnxruntime").exists()
    areas = listing(capfd)
    assert areas["deploy"]["entries"] == areas["artifacts"]["entries"] == 0
    assert areas["test-llm"]["entries"] == areas["host"]["entries"] == 1
    r = run_cli(capfd, "cache", "clear", "test-llm")
    assert r.returncode == 0 and "removed 1 entries of test-llm" in r.stdout
    assert not (root / "test-llm" / "qwen3-random").exists() and (root / "host" / "bandwidth-1.json").exists()


def test_clear_leaves_an_entry_being_built_and_a_live_build_temporary(root, capfd):
    building = root / "artifacts" / "onnxruntime" / "99aa"
    temporary = root / "deploy" / files.temp_name("deploy")  # this process's: its owner is alive
    temporary.mkdir()
    with cache.locked(building):
        result = cache.clear(["deploy", "artifacts"])
    assert sorted(result["busy"]) == sorted([str(building), str(temporary)])
    assert building.is_dir() and temporary.is_dir() and not (root / "deploy" / "0123abcd").exists()
    assert result["removed_entries"] == 2


def test_an_unknown_area_is_one_line_and_exit_2(root, capfd):
    r = run_cli(capfd, "cache", "clear", "bundles")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no cache area 'bundles'" in r.stderr and "deploy" in r.stderr
    assert (root / "deploy" / "0123abcd").is_dir()


def test_clear_older_than_keeps_an_entry_reused_since(root, capfd):
    """--older-than DAYS removes what was neither built nor reused in that time: a reuse (an entry found intact)
    sets the entry's time to now."""
    month_ago = time.time() - 30 * 86400
    reused = root / "deploy" / "0123abcd"
    cache.seal_entry(reused)
    for e in cache.entries("deploy") + cache.entries("artifacts"):
        os.utime(e, (month_ago, month_ago))
    assert cache.intact(reused)  # what deploy asks before it copies a cached bundle
    r = run_cli(capfd, "cache", "clear", "--older-than", "7", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["removed_entries"] == 2 and out["older_than_s"] == 7 * 86400
    assert reused.is_dir() and not (root / "artifacts" / "onnxruntime" / "99aa").exists()
    r = run_cli(capfd, "cache", "clear", "--older-than", "-1")
    assert r.returncode == 2 and reused.is_dir()
