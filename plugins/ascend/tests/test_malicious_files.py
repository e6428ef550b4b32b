"""Malicious model files for the Ascend backend: nothing in them runs, through the real CLI.

Every crafted file would create a marker file if code from it ran (see evil_pt2.py). The first test
shows the live payloads do fire against plain ``torch.export.load`` — so the others can fail — and
the rest run ``edgeinfer run`` on them as a user would: exit 2, one line on stderr, no traceback,
no marker, nothing written (in-process through ``edgeinfer.cli.invoke``; the first case of each kind of
file also as ``python -m edgeinfer.cli``).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.testing import models
from edgeinfer.testing.cli import run_cli

sys.path.insert(0, str(Path(__file__).parent))
import evil_pt2  # noqa: E402


@pytest.fixture(scope="module")
def base_pt2(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pt2-base")
    return models.export_pt2(models.mlp(root), root)


@pytest.fixture
def x_npy(tmp_path) -> Path:
    p = tmp_path / "x.npy"
    np.save(p, np.ones((3, 16), np.float32))
    return p


def _subprocess_cli(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ, "EDGEINFER_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "edgeinfer.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.fixture
def cli(monkeypatch, capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): no interpreter start-up and torch
    import per case. With ``fresh_process=True`` (the first case of each parametrized test) it runs
    ``python -m edgeinfer.cli`` instead, so what shows only in a fresh interpreter is still caught."""

    def run(*args: str, cwd: Path, cache: Path, fresh_process: bool = False) -> subprocess.CompletedProcess:
        if fresh_process:
            return _subprocess_cli(*args, cwd=cwd, cache=cache)
        monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(cache))
        monkeypatch.chdir(cwd)
        return run_cli(capfd, *args)

    return run


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def _refused(proc: subprocess.CompletedProcess, marker: Path) -> str:
    assert not marker.exists(), "code from the file ran"
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_live_payloads_fire_against_plain_torch(base_pt2, tmp_path):
    """The corpus is live: plain torch.export.load(...).module()(x) runs each payload."""
    markers = {}
    for kind in evil_pt2.LIVE:
        markers[kind] = tmp_path / f"marker-{kind}"
        evil_pt2.craft(base_pt2, kind, tmp_path / f"{kind}.pt2", markers[kind])
    script = (
        "import sys, torch\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        torch.export.load(p).module()(torch.ones(3, 16))\n"
        "    except Exception:\n"
        "        pass\n"
    )
    subprocess.run([sys.executable, "-c", script, *(str(tmp_path / f"{k}.pt2") for k in markers)],
                   capture_output=True, timeout=300)
    assert {k: m.exists() for k, m in markers.items()} == {k: True for k in markers}


@pytest.mark.parametrize("kind", list(evil_pt2.ALL))
def test_crafted_pt2_is_refused_by_run(base_pt2, x_npy, tmp_path, kind, cli):
    marker = tmp_path / "MARKER"
    evil = evil_pt2.craft(base_pt2, kind, tmp_path / "evil.pt2", marker)
    cache = tmp_path / "cache"
    before = _files(tmp_path)
    line = _refused(cli("run", str(evil), "--backend", "ascend", "-i", f"x={x_npy}", cwd=tmp_path, cache=cache,
                        fresh_process=kind == list(evil_pt2.ALL)[0]), marker)
    assert "evil.pt2" in line
    assert _files(tmp_path) == before  # no cache entry, no output, nothing left behind


def _ascend_artifact(program: bytes, out: Path) -> Path:
    manifest = {"format": 1, "kind": "export", "dtype": "fp32", "quant": None, "scheme": "fp32",
                "inputs": [{"name": "x", "shape": ["batch", 16], "dtype": "float32"}],
                "outputs": [{"name": "output", "shape": ["batch", 8], "dtype": "float32"}]}
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("manifest.json", json.dumps(manifest))
        z.writestr("program.pt2", program)
    return out


@pytest.mark.parametrize("kind", ["pickled_sample_inputs", "guards_code", "pickled_weight"])
def test_ascend_artifact_holding_a_crafted_program_is_refused(base_pt2, x_npy, tmp_path, kind, cli):
    marker = tmp_path / "MARKER"
    evil = evil_pt2.craft(base_pt2, kind, tmp_path / "evil.pt2", marker)
    art = _ascend_artifact(evil.read_bytes(), tmp_path / "evil.ascend")
    before = _files(tmp_path)
    line = _refused(cli("run", str(art), "-i", f"x={x_npy}", cwd=tmp_path, cache=tmp_path / "cache",
                        fresh_process=kind == "pickled_sample_inputs"), marker)
    assert "program.pt2" in line
    assert _files(tmp_path) == before


@pytest.mark.parametrize("kind", ["pickled_sample_inputs", "sympy_expr"])
def test_bundle_holding_a_crafted_program_is_refused(base_pt2, x_npy, tmp_path, kind, cli):
    from edgeinfer.contract import TensorSpec
    from edgeinfer.model.bundle import Manifest, write

    marker = tmp_path / "MARKER"
    evil = evil_pt2.craft(base_pt2, kind, tmp_path / "evil.pt2", marker)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    _ascend_artifact(evil.read_bytes(), bundle / "model.ascend")
    evil.unlink()
    write(bundle, Manifest(backend="ascend", board="atlas-300i-pro", scheme="fp32", artifacts=["model.ascend"],
                           inputs=[TensorSpec("x", ("batch", 16), "float32")],
                           outputs=[TensorSpec("output", ("batch", 8), "float32")], source={"name": "evil.pt2"}))
    before = _files(tmp_path)
    _refused(cli("run", str(bundle), "-i", f"x={x_npy}", cwd=tmp_path, cache=tmp_path / "cache",
                 fresh_process=kind == "pickled_sample_inputs"), marker)
    assert _files(tmp_path) == before


def _torch_save(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.parametrize("container", ["torch_zip", "raw_pickle"])
def test_weights_file_with_a_pickle_payload_is_refused(tmp_path, container, cli):
    import pickle

    marker = tmp_path / "MARKER"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    payload = {"embeddings.weight": evil_pt2.Payload(marker)}
    blob = _torch_save(payload) if container == "torch_zip" else pickle.dumps(payload)
    (hf / "pytorch_model.bin").write_bytes(blob)
    ids = tmp_path / "ids.npy"
    np.save(ids, np.ones((1, 4), np.int64))
    before = _files(tmp_path)
    line = _refused(cli("run", str(hf), "--backend", "ascend", "-i", f"input_ids={ids}", cwd=tmp_path,
                        cache=tmp_path / "cache", fresh_process=container == "torch_zip"), marker)
    assert "pytorch_model.bin" in line
    assert _files(tmp_path) == before


# --- the checks themselves, on what the live corpus does not cover ---------------------------------------


def _spec(type_name, context) -> str:
    return json.dumps([1, {"type": type_name, "context": context, "children_spec": []}])


@pytest.mark.parametrize(
    "spec,needle",
    [
        (_spec("collections.defaultdict", json.dumps({"default_factory_module": "os",
                                                      "default_factory_name": "system",
                                                      "dict_context": []})), "collections.defaultdict"),
        (_spec("builtins.dict", json.dumps([{"__enum__": True, "fqn": "os:environ", "name": "x"}])), "plain keys"),
    ],
)
def test_pytree_specs_that_import_modules_are_refused(base_pt2, tmp_path, spec, needle):
    from edgeinfer_ascend import pt2

    files = evil_pt2.members(base_pt2)
    doc = json.loads(files["models/model.json"])
    doc["graph_module"]["module_call_graph"][0]["signature"]["in_spec"] = spec
    files["models/model.json"] = json.dumps(doc).encode()
    evil = evil_pt2.write(tmp_path / "evil.pt2", files)
    with pytest.raises(pt2.UnsafeProgram, match=needle):
        pt2.sanitized(evil.read_bytes(), evil.name)


def test_a_checked_program_still_runs_and_matches(base_pt2):
    """The rebuilt archive is the same program: same outputs as the unchecked load of a trusted file."""
    import torch
    from edgeinfer_ascend import pt2

    x = torch.randn(3, 16)
    checked = pt2.load(base_pt2.read_bytes(), base_pt2.name).module()(x)
    trusted = torch.export.load(str(base_pt2)).module()(x)
    torch.testing.assert_close(checked, trusted)


def test_crafted_program_swapped_into_the_cache_is_not_loaded(base_pt2, x_npy, tmp_path, cli):
    """A converted .pt2 is cached as an .ascend artifact; swapping in a crafted one is detected (seal) and
    the entry is converted again from the real source, so the payload never reaches torch."""
    marker = tmp_path / "MARKER"
    cache = tmp_path / "cache"
    run = ("run", str(base_pt2), "--backend", "ascend", "-i", f"x={x_npy}", "--json")
    first = cli(*run, cwd=tmp_path, cache=cache)
    assert first.returncode == 0, first.stderr[-2000:]
    (cached,) = cache.rglob("*.ascend")
    evil = evil_pt2.craft(base_pt2, "pickled_sample_inputs", tmp_path / "evil.pt2", marker)
    _ascend_artifact(evil.read_bytes(), cached)
    again = cli(*run, cwd=tmp_path, cache=cache)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not marker.exists()
    with zipfile.ZipFile(cached) as z:
        assert z.read("program.pt2") != evil.read_bytes()  # converted again from the real source
    assert json.loads(again.stdout)["outputs"] == json.loads(first.stdout)["outputs"]


@pytest.mark.parametrize("change,needle", [
    ("compressed", "compressed"),
    ("from_file", "torch.ops.aten.from_file.default"),
    ("duplicate", "twice"),
])
def test_archive_tricks_are_refused(base_pt2, tmp_path, change, needle):
    from edgeinfer_ascend import pt2

    files = evil_pt2.members(base_pt2)
    if change == "from_file":  # a node that would read a local file into the program's output
        doc = json.loads(files["models/model.json"])
        doc["graph_module"]["graph"]["nodes"][0]["target"] = "torch.ops.aten.from_file.default"
        files["models/model.json"] = json.dumps(doc).encode()
    data = evil_pt2.write(tmp_path / "p.pt2", files).read_bytes()
    if change in ("compressed", "duplicate"):
        buf = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w") as dst:
            for info in src.infolist():
                blob = src.read(info)
                kind = zipfile.ZIP_DEFLATED if change == "compressed" else zipfile.ZIP_STORED
                dst.writestr(info.filename, blob, compress_type=kind)
                if change == "duplicate" and info.filename.endswith("models/model.json"):
                    with pytest.warns(UserWarning):
                        dst.writestr(info.filename, blob)
        data = buf.getvalue()
    with pytest.raises(pt2.UnsafeProgram, match=needle):
        pt2.sanitized(data, "p.pt2")


EXPRESSION_BOMBS = {
    "power-tower": "Integer(10)**Integer(10)**Integer(12)",
    "power-tower-plain": "10**10**12",
    "power-call": "Pow(Integer(2), Integer(100000000))",
    "pow-by-natural": "PowByNatural(Integer(7), Integer(99999999))",
    "huge-exponent-on-a-symbol": "Symbol('s77', positive=True, integer=True)**Integer(10)**Integer(12)",
    "long-product": "Mul(" + ", ".join(["Integer(1000000000000000000)"] * 80) + ")",
    "huge-literal": "Integer(" + "9" * 400 + ")",
    "huge-string-literal": "Integer('1e99999999')",
    "shift": "LShift(Integer(1), Integer(100000000))",
    "shift-operator": "1 << 100000000",
    "deep-nesting": "Add(" * 100 + "1" + ")" * 100,
}


@pytest.mark.parametrize("expr", EXPRESSION_BOMBS.values(), ids=EXPRESSION_BOMBS.keys())
def test_symbolic_shapes_that_sympy_would_compute_for_ever_are_refused(base_pt2, tmp_path, expr):
    """Each expression uses only the shape vocabulary; sympify would hang or fill memory computing it."""
    import time

    from edgeinfer_ascend import pt2

    files = evil_pt2.members(base_pt2)
    evil_pt2.set_expr(files, expr)
    data = evil_pt2.write(tmp_path / "p.pt2", files).read_bytes()
    start = time.monotonic()
    with pytest.raises(pt2.UnsafeProgram, match="symbolic shape expression"):
        pt2.sanitized(data, "p.pt2")
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("expr", ["Symbol('s77', positive=True, integer=True)",
                                  "Mul(Integer(2), Symbol('s77', positive=True, integer=True))",
                                  "2**62", "Max(1, s77)", "FloorDiv(s77 + 3, 4)", "PowByNatural(s77, 2)",
                                  "Piecewise((s77, Eq(s77, 1)), (1, True))"])
def test_ordinary_shape_expressions_pass_the_bound(base_pt2, tmp_path, expr):
    from edgeinfer_ascend import pt2

    files = evil_pt2.members(base_pt2)
    evil_pt2.set_expr(files, expr)
    clean = pt2.sanitized(evil_pt2.write(tmp_path / "p.pt2", files).read_bytes(), "p.pt2")
    assert expr in clean.decode("latin-1")
