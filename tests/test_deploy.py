"""Deploy the same model to three kinds of board (real OpenVINO CPU, RKNN simulator, Ascend CPU path),
golden-check it, run it with the same command, and refuse bad quantization."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.model import bundle as bundle_mod
from edgeinfer.testing import minilm
from edgeinfer.testing.cli import run_cli

BOARDS = {  # board → (backend, device the bundle actually runs on here)
    "core-ultra-155h": ("openvino", "CPU"),
    "rk3588-8g": ("rknn", "simulator"),
    "atlas-300i-pro": ("ascend", "cpu"),
}
# RKNN simulator conversions are slow: that bundle keeps the single static shape (buckets: tests/test_buckets.py)
NO_BUCKETS = {"rk3588-8g": ("--buckets", "none")}
TEXTS = ["The train to Berlin was delayed by forty minutes.", "Solar panels convert sunlight into electricity."]


@pytest.fixture(scope="module")
def cache() -> Path:
    """The user's conversion cache (edgeinfer.contract.cache.root(), ~/.cache/edgeinfer), as the README's deploys
    use it: a machine's first run converts (about a minute for the three boards), later runs reuse the sealed
    entries. Fresh conversions through deploy run every time in test_bad_quantization_is_caught_not_shipped
    (not stored: it fails), tests/test_malicious_files.py and the plugins' own tests."""
    from edgeinfer.contract import cache as conversion_cache

    return conversion_cache.root()


@pytest.fixture(scope="module")
def env(cache) -> dict[str, str]:
    return {"EDGEINFER_CACHE_DIR": str(cache)}


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): these tests are about what the commands
    do, not about the process, and each subprocess would import torch, openvino or the RKNN toolkit again."""
    return functools.partial(run_cli, capfd)


@pytest.fixture(scope="module")
def golden_txt(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("golden") / "heldout.txt"
    p.write_text("\n".join(minilm.heldout_sentences(16)) + "\n")
    return p


@pytest.fixture(scope="module")
def bundles(module_tmp, env, golden_txt) -> dict[str, Path]:
    """The first deploy fills the cache with the reference export (on a machine's first run); the other two then
    run side by side."""
    root = module_tmp

    def deploy(board: str) -> subprocess.Popen:
        args = ["deploy", str(minilm.model_dir()), "--board", board, "--golden-inputs", str(golden_txt),
                *NO_BUCKETS.get(board, ()), "-o", str(root / board), "--json"]
        return subprocess.Popen([sys.executable, "-m", "edgeinfer.cli", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, **env))

    def check(proc: subprocess.Popen) -> None:
        stdout, stderr = proc.communicate(timeout=1200)
        assert proc.returncode == 0, stderr[-2000:]
        assert json.loads(stdout)["golden"]["passed"] is True

    first, *rest = BOARDS
    check(deploy(first))
    for proc in [deploy(board) for board in rest]:
        check(proc)
    return {board: root / board for board in BOARDS}


@functools.cache  # the same texts for every board: one session, one run
def reference_embeddings(texts: tuple[str, ...]) -> np.ndarray:
    """Independent reference: onnxruntime fp32 on a direct export, pooled with the test helpers."""
    import onnxruntime as ort

    from edgeinfer.testing.fixtures import _cached_export

    path = _cached_export("minilm-dynamic", None, None)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = minilm.tokenize(list(texts))
    (hidden,) = sess.run(None, feeds)
    emb = minilm.mean_pool(hidden, feeds["attention_mask"])
    return emb / np.linalg.norm(emb, axis=1, keepdims=True)


@pytest.mark.slow
@pytest.mark.parametrize("board", list(BOARDS))
def test_bundle_manifest_and_golden(bundles, board):
    import jsonschema

    path = bundles[board]
    manifest = json.loads((path / "manifest.json").read_text())
    schema = json.loads((Path(bundle_mod.__file__).parents[1] / "schemas" / "manifest.schema.json").read_text())
    jsonschema.validate(manifest, schema)
    backend, device = BOARDS[board]
    assert manifest["backend"]["name"] == backend and manifest["board"] == board
    assert manifest["golden"]["passed"] and manifest["golden"]["device"] == device
    assert manifest["golden"]["outputs"]["last_hidden_state"]["cosine_min"] >= 0.99
    assert manifest["source"]["sha256"] and manifest["plan"]["fits"] is True
    assert "toolkit" in manifest["backend"]["versions"]
    for name in manifest["artifacts"]:
        assert (path / name).is_file()
    assert (path / "tokenizer" / "tokenizer.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("board", list(BOARDS))
def test_same_run_text_command_on_every_bundle(bundles, board, cli):
    args = ["run", str(bundles[board]), "--json"]
    for t in TEXTS:
        args += ["--text", t]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["device"] == BOARDS[board][1]
    got = np.array(report["embeddings"])
    assert got.shape == (2, 384)
    cos = (got * reference_embeddings(tuple(TEXTS))).sum(1) / np.linalg.norm(got, axis=1)
    assert np.all(cos > 0.99), cos


@pytest.mark.slow
def test_golden_command_rechecks_a_bundle(bundles, cli):
    path = bundles["core-ultra-155h"]
    ok = cli("golden", str(path), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["passed"] is True
    # tamper with the recorded expectation: the re-check must now fail with exit 1
    broken = path.parent / "tampered"
    import shutil

    shutil.copytree(path, broken)
    exp = bundle_mod.Bundle.open(broken).path / "golden" / "expected.npz"
    data = dict(np.load(exp))
    np.savez(exp, **{k: -v for k, v in data.items()})
    damaged = cli("golden", str(broken))  # the seal notices first (docs/deploy.md, sealed bundles)
    assert damaged.returncode == 2 and "golden/expected.npz" in damaged.stderr
    bundle_mod.write(broken, bundle_mod.read_manifest(broken))  # re-seal: now the comparison itself must fail
    bad = cli("golden", str(broken))
    assert bad.returncode == 1 and "golden check failed" in bad.stderr


@pytest.mark.slow
def test_second_deploy_is_cached(bundles, env, golden_txt, tmp_path, cli):
    proc = cli(
        "deploy", str(minilm.model_dir()), "--board", "core-ultra-155h", "--golden-inputs", str(golden_txt),
        "-o", str(tmp_path / "again"), "--json", env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["cached"] is True
    assert "reusing the cached conversion" in proc.stderr
    same = (tmp_path / "again" / "model.xml").read_bytes() == (bundles["core-ultra-155h"] / "model.xml").read_bytes()
    assert same


def test_board_only_leaves_out_what_only_the_simulator_reads(bundles, env, golden_txt, tmp_path, cli):
    """--board-only: the RKNN bundle without its simulator sources (the same cached conversion, the same .rknn),
    sealed without them; on this PC the simulator then refuses it in one line. An OpenVINO bundle has nothing to
    leave out."""
    def deploy(board: str, out: Path) -> subprocess.CompletedProcess:
        proc = cli("deploy", str(minilm.model_dir()), "--board", board, "--golden-inputs", str(golden_txt),
                   *NO_BUCKETS.get(board, ()), "--board-only", "-o", str(out), "--json", env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc

    full, slim = bundles["rk3588-8g"], tmp_path / "rk-board"
    report = json.loads(deploy("rk3588-8g", slim).stdout)
    assert report["cached"] is True and report["left_out"] == ["model.rknn.src.onnx", "model.rknn.src.tar"]
    assert not list(slim.rglob("*.src.*")) and (full / "model.rknn.src.onnx").is_file()
    assert (slim / "model.rknn").read_bytes() == (full / "model.rknn").read_bytes()
    manifest = json.loads((slim / "manifest.json").read_text())
    assert manifest["left_out"] == report["left_out"] and not set(manifest["files"]) & set(report["left_out"])
    assert "left_out" not in json.loads((full / "manifest.json").read_text())
    import jsonschema

    jsonschema.validate(manifest, json.loads((Path(bundle_mod.__file__).parents[1] / "schemas" /
                                              "manifest.schema.json").read_text()))
    saved = sum((full / f).stat().st_size for f in report["left_out"])
    assert saved > 0.6 * sum(f.stat().st_size for f in full.rglob("*") if f.is_file())  # most of the bundle
    assert cli("verify", str(slim)).returncode == 0
    # a new process: one that built this model takes it over in the simulator (plugins/rknn/README.md)
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "run", str(slim), "--text", "hello"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, **env))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--board-only" in proc.stderr

    proc = deploy("core-ultra-155h", tmp_path / "ov-board")
    assert json.loads(proc.stdout)["left_out"] == []
    assert sorted(p.name for p in (tmp_path / "ov-board").iterdir()) == sorted(
        p.name for p in bundles["core-ultra-155h"].iterdir())


@pytest.mark.slow
def test_bench_writes_json_and_png(bundles, tmp_path, cli):
    png = tmp_path / "bench.png"
    proc = cli("bench", str(bundles["rk3588-8g"]), "--batch", "1,2", "--repeat", "2", "--json", "--plot",
                     str(png))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["device"] == "simulator" and report["static_batch"] == 1
    assert [r["batch"] for r in report["results"]] == [1, 2]
    assert report["results"][1]["runs_per_call"] == 2  # static batch 1: two calls for batch 2
    assert all("others_busy_cpus" in r for r in report["results"]) and isinstance(report["notes"], list)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_bad_quantization_is_caught_not_shipped(env, golden_txt, tmp_path, cli):
    n = 8  # a handful of constant inputs: every token the same
    calib = tmp_path / "constant.npz"
    np.savez(
        calib,
        input_ids=np.full((n, 128), 1012, np.int64),
        attention_mask=np.ones((n, 128), np.int64),
        token_type_ids=np.zeros((n, 128), np.int64),
    )
    out = tmp_path / "bad"
    proc = cli(
        "deploy", str(minilm.model_dir()), "--board", "core-ultra-155h", "--quant", "int8", "--calib", str(calib),
        "--golden-inputs", str(golden_txt), "-o", str(out), env=env,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "golden check FAILED" in proc.stderr and "sample" in proc.stderr
    assert not out.exists()


# --- input errors (fast) ------------------------------------------------------------------------------


def test_model_that_does_not_fit_is_refused(tmp_path, env, cli):
    tiny = tmp_path / "tiny-board.yaml"
    src = (Path(bundle_mod.__file__).parents[1] / "_boards" / "core-ultra-155h.yaml").read_text()
    import re

    src = re.sub(r"(memory_total_gib:\n  value: )[0-9.]+", r"\g<1>0.01", src.replace("core-ultra-155h", "tiny-test"))
    assert "value: 0.01" in src
    tiny.write_text(src)
    proc = cli("deploy", str(minilm.model_dir()), "--board", str(tiny), "-o", str(tmp_path / "b"), env=env)
    assert proc.returncode == 1, proc.stderr
    assert "does not fit" in proc.stderr and not (tmp_path / "b").exists()


def test_calibration_sample_with_wrong_input_name_is_named(tmp_path, env, minilm_onnx, cli):
    np.savez(tmp_path / "calib.npz", input_ids=np.ones((4, 128), np.int64), mask=np.ones((4, 128), np.int64))
    proc = cli(
        "deploy", str(minilm_onnx), "--board", "core-ultra-155h", "--quant", "int8", "--calib",
        str(tmp_path / "calib.npz"), "-o", str(tmp_path / "b"), env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "calibration sample calib.npz[0]" in proc.stderr and "'mask'" in proc.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--quant", "w4a16"], "w4a16"),  # rk3588 has no 4-bit weight path
        (["--shape", "input_ids=1xabc"], "NAME=DIMxDIM"),
        (["--quant", "int8"], "needs calibration data"),
    ],
)
def test_bad_deploy_options(tmp_path, env, minilm_onnx, args, needle, cli):
    proc = cli("deploy", str(minilm_onnx), "--board", "rk3588-8g", *args, "-o", str(tmp_path / "b"), env=env)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_paged_bundle_on_the_host_board_matches_the_plain_one(tmp_path, env, cli):
    texts = ["Paging keeps only a window of layers resident."]
    plain, paged = tmp_path / "plain", tmp_path / "paged"
    for out, extra in ((plain, []), (paged, ["--paging", "2", "--segments", "6"])):
        proc = cli("deploy", str(minilm.model_dir()), "--board", "host", *extra, "-o", str(out), env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((paged / "manifest.json").read_text())
    assert manifest["paging"]["window"] == 2 and len(manifest["artifacts"]) == 6
    # the id limits serve checks requests against, recorded so that it need not read the model: MiniLM's tables
    cfg = json.loads((minilm.model_dir() / "config.json").read_text())
    tables = {"input_ids": cfg["vocab_size"], "token_type_ids": cfg["type_vocab_size"]}
    assert manifest["index_limits"] == tables
    assert json.loads((plain / "manifest.json").read_text())["index_limits"] == tables
    runs = [json.loads(cli("run", str(p), "--text", texts[0], "--json").stdout) for p in (plain, paged)]
    assert runs[1]["paging"]["segments"] == 6
    np.testing.assert_array_equal(np.array(runs[0]["embeddings"]), np.array(runs[1]["embeddings"]))


def test_paging_options_are_checked(tmp_path, env, minilm_onnx, cli):
    proc = cli("deploy", str(minilm_onnx), "--board", "host", "--segments", "3", "-o", str(tmp_path / "b"))
    assert proc.returncode == 2 and "add --paging W" in proc.stderr
