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


# --- the bound: EDGEINFER_CACHE_MAX_GB ---------------------------------------------------------------------


def _aged(entry, days: float) -> None:
    t = time.time() - days * 86400
    os.utime(entry, (t, t))


def test_a_build_over_the_bound_removes_the_least_recently_used_conversions(root, monkeypatch, capfd):
    """Over the bound, the oldest conversions go first, until the rest fit; the entry just built, what is not a
    conversion and an entry reused since stay."""
    old_bundle, old_export = root / "deploy" / "0123abcd", root / "deploy" / "onnx" / "fedc4321"
    artifact = root / "artifacts" / "onnxruntime" / "99aa"
    for e in (old_export, artifact):  # a MiB each, as the bundle and the new entry
        (e / "model.onnx").write_bytes(os.urandom(MIB))
    _aged(old_bundle, 30)
    _aged(old_export, 20)
    _aged(artifact, 10)
    monkeypatch.setenv(cache.MAX_ENV, str(2.5 * MIB / 1e9))  # 4 MiB after the build: two must go
    new = root / "artifacts" / "onnxruntime" / "new"
    cache.fill(new, lambda d: (d / "model.onnx").write_bytes(os.urandom(MIB)))
    err = capfd.readouterr().err
    assert new.is_dir() and artifact.is_dir() and not old_bundle.exists() and not old_export.exists()
    assert "removed 2 least recently used entries" in err and cache.MAX_ENV in err
    assert (root / "test-llm" / "qwen3-random").is_dir() and (root / "host" / "bandwidth-1.json").exists()
    assert cache.conversions_bytes() <= cache.max_bytes()


def test_the_bound_passes_over_an_entry_being_built_and_reuse_makes_an_entry_recent(root, monkeypatch, capfd):
    old_bundle, artifact = root / "deploy" / "0123abcd", root / "artifacts" / "onnxruntime" / "99aa"
    for e in (root / "deploy" / "onnx" / "fedc4321", artifact):  # a MiB each, as the bundle
        (e / "model.onnx").write_bytes(os.urandom(MIB))
    cache.seal_entry(old_bundle)
    for e in (old_bundle, root / "deploy" / "onnx" / "fedc4321", artifact):
        _aged(e, 30)
    _aged(artifact, 40)  # the oldest
    assert cache.intact(old_bundle)  # reused now: the newest of the three
    monkeypatch.setenv(cache.MAX_ENV, str(2.75 * MIB / 1e9))  # 3.5 MiB after the build: the export must go
    with cache.locked(artifact, wait=False):  # e.g. another process building it
        cache.fill(root / "deploy" / "new", lambda d: (d / "x.bin").write_bytes(os.urandom(MIB // 2)))
    assert artifact.is_dir() and old_bundle.is_dir() and not (root / "deploy" / "onnx" / "fedc4321").exists()


def test_reuse_under_the_bound_removes_nothing_and_off_turns_it_off(root, monkeypatch, capfd):
    monkeypatch.setenv(cache.MAX_ENV, "off")
    assert cache.max_bytes() is None
    cache.fill(root / "deploy" / "new", lambda d: (d / "x.bin").write_bytes(os.urandom(MIB)))
    monkeypatch.setenv(cache.MAX_ENV, "1")
    assert cache.bound() is None
    assert len(cache.entries("deploy")) == 3 and "conversion cache" not in capfd.readouterr().err


@pytest.mark.parametrize("value", ["-1", "0", "lots", "nan", "inf"])
def test_a_bad_bound_is_one_clear_line_and_the_build_stays(root, monkeypatch, capfd, value):
    from edgeinfer.errors import InputError

    monkeypatch.setenv(cache.MAX_ENV, value)
    with pytest.raises(InputError, match=f"{cache.MAX_ENV} must be a size in GB above 0, or off; got '{value}'"):
        cache.fill(root / "deploy" / "new", lambda d: (d / "x.bin").write_bytes(b"x"))
    assert cache.intact(root / "deploy" / "new")
    r = run_cli(capfd, "cache", "--json")
    assert r.returncode == 2 and cache.MAX_ENV in r.stdout


def test_an_entry_removed_by_another_process_meanwhile_is_no_error(root, monkeypatch):
    gone = root / "deploy" / "0123abcd"
    real_entries = cache.entries

    def entries_then_removed(name):  # listed, then removed by someone else before this process gets to it
        found = real_entries(name)
        if gone in found:
            import shutil

            shutil.rmtree(gone)
        return found

    monkeypatch.setattr(cache, "entries", entries_then_removed)
    result = cache.clear(["deploy"])
    assert result["busy"] == [] and not gone.exists() and not (root / "deploy" / "onnx").exists()


def test_processes_building_at_once_under_a_small_bound_all_finish(root, monkeypatch):
    """Four processes each build an entry of a MiB at once with room for two: every build succeeds (a concurrent
    bound passes over an entry being built: its temporary and its lock) and leaves nothing held."""
    import subprocess
    import sys

    monkeypatch.setenv(cache.MAX_ENV, str(2.5 * MIB / 1e9))
    code = ("import os, sys\nfrom pathlib import Path\nfrom edgeinfer.contract import cache\n"
            "e = cache.area('artifacts') / 'onnxruntime' / sys.argv[1]\n"
            "cache.fill(e, lambda d: (d / 'm.bin').write_bytes(os.urandom(1 << 20)))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, f"p{i}"], stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errs
    assert any("least recently used" in e for e in errs)
    # builds that end together may each pass over the other's entry (held): nothing is left held or half-built,
    # so the next bound fits
    assert not list(root.rglob("*.tmp*")) and not (root / "locks").exists()
    cache.bound()
    assert cache.conversions_bytes() <= cache.max_bytes()


def test_clear_to_a_size_removes_the_least_recently_used_first_and_dry_run_removes_nothing(root, capfd):
    for e in (root / "deploy" / "onnx" / "fedc4321", root / "artifacts" / "onnxruntime" / "99aa"):
        (e / "model.onnx").write_bytes(os.urandom(MIB))  # a MiB each, as the bundle
    _aged(root / "deploy" / "0123abcd", 30)
    _aged(root / "deploy" / "onnx" / "fedc4321", 20)
    _aged(root / "artifacts" / "onnxruntime" / "99aa", 10)
    to = str(1.5 * MIB / 1e9)  # room for one of the three
    r = run_cli(capfd, "cache", "clear", "--to", to, "--dry-run", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["dry_run"] and len(out["removed"]) == 2
    assert (root / "deploy" / "0123abcd").is_dir() and (root / "deploy" / "onnx" / "fedc4321").is_dir()
    r = run_cli(capfd, "cache", "clear", "--to", to)
    assert r.returncode == 0 and "removed 2 least recently used conversions" in r.stdout
    assert not (root / "deploy" / "0123abcd").exists() and not (root / "deploy" / "onnx").exists()
    assert (root / "artifacts" / "onnxruntime" / "99aa").is_dir() and cache.conversions_bytes() <= 1.5 * MIB
    assert (root / "test-llm" / "qwen3-random").is_dir()  # not a conversion
    for bad in (["--to", "-1"], ["--to", "1", "deploy"], ["--to", "1", "--older-than", "3"]):
        r = run_cli(capfd, "cache", "clear", *bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--to" in r.stderr
