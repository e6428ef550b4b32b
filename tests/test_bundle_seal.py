"""Sealed bundles through the real CLI: a tampered-bundle corpus.

Every case copies a real bundle, changes one manifest field or one file, runs the real command
and asserts exit 2, a single ``error:`` line on stderr without traceback, a message naming the
field or file, and that nothing new was written. Two bundles are built once per module: an
OpenVINO bundle written by a real ``edgeinfer deploy`` and a small text bundle (onnxruntime,
MiniLM's tokenizer) written with ``bundle.write``, so both ways of sealing are covered.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from helpers import edgeinfer

from edgeinfer.testing import minilm, models
from edgeinfer.testing.cli import in_process_cli

# --- the bundles -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("seal-cache")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, cache) -> Path:
    """An OpenVINO bundle of the kit MLP (batch 2), written by `edgeinfer deploy`."""
    root = tmp_path_factory.mktemp("seal-deployed")
    mlp = models.mlp(root, batch=2)
    out = root / "bundle"
    proc = edgeinfer("deploy", str(mlp.path), "--board", "core-ultra-155h", "-o", str(out), "--json",
                     env={"EDGEINFER_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def text_bundle(tmp_path_factory) -> Path:
    from edgeinfer.contract import registry as plugins
    from edgeinfer.model.bundle import Manifest, TextSpec, write

    out = tmp_path_factory.mktemp("seal-text") / "bundle"
    out.mkdir()
    models.token_model(out / "model.onnx")
    (out / "tokenizer").mkdir()
    shutil.copy(minilm.model_dir() / "tokenizer.json", out / "tokenizer" / "tokenizer.json")
    with plugins.get_backend("onnxruntime").load(out / "model.onnx") as s:
        inputs, outputs = list(s.inputs), list(s.outputs)
    write(out, Manifest(backend="onnxruntime", board="host", scheme="fp32", artifacts=["model.onnx"],
                        inputs=inputs, outputs=outputs, source={"name": "tokens.onnx"},
                        text=TextSpec(max_length=16, pooling="mean", normalize=False)))
    return out


@pytest.fixture(scope="module")
def x_npy(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("seal-x") / "x.npy"
    np.save(p, np.ones((2, 16), np.float32))
    return p


# --- helpers ------------------------------------------------------------------------------------------


# ``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): every case is about what the command
# answers, not about the process (the deploy above is a real subprocess).
cli, _bind_capfd = in_process_cli()


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _edit(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
    mf = bundle / "manifest.json"
    data = json.loads(mf.read_text())
    change(data)
    mf.write_text(json.dumps(data))


def _files(root: Path) -> dict[Path, int]:
    return {p: p.lstat().st_mtime_ns for p in root.rglob("*")}


def _refused(proc, needle: str | None = None) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "internal error" not in lines[0]
    if needle:
        assert needle in lines[0], lines[0]
    return lines[0]


def _run_plain(bundle: Path, x: Path, tmp_path: Path):
    return cli("run", str(bundle), "-i", f"x={x}", "--out", str(tmp_path / "out"))


def _run_text(bundle: Path, tmp_path: Path):
    return cli("run", str(bundle), "--text", "hello world", "--out", str(tmp_path / "out"))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A manifest change: set the dotted ``path`` (list indices as numbers) to ``value``; ``...`` deletes it."""
    def change(data: dict[str, Any]) -> None:
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        target = data
        for k in keys[:-1]:
            target = target[k]
        if value is ...:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
    return change


def _check_refused(proc, tmp_path: Path, before: dict[Path, int], needle: str | None) -> None:
    _refused(proc, needle)
    assert _files(tmp_path) == before, "something was written"


# --- manifest fields (plain bundle) -------------------------------------------------------------------

PLAIN_FIELDS = [
    ("artifact-dotdot", _set("artifacts", ["../../outside/model.xml"]), "artifacts[0]"),
    ("artifact-absolute", _set("artifacts", ["/etc/hostname"]), "absolute path"),
    ("artifact-empty-list", _set("artifacts", []), "artifacts"),
    ("artifact-not-a-list", _set("artifacts", "model.xml"), "artifacts"),
    ("artifact-number", _set("artifacts", [5]), "artifacts.0"),
    ("artifact-twice", _set("artifacts", ["model.xml", "model.xml"]), "twice"),
    ("artifact-unrecorded", _set("artifacts", ["model.xml.stamp.jsonx"]), "recorded files"),
    ("artifact-backslash", _set("artifacts", ["..\\..\\model.xml"]), "artifacts[0]"),
    ("artifact-nul", _set("artifacts", ["model.xml\u0000"]), "artifacts[0]"),
    ("artifact-dot", _set("artifacts", ["."]), "artifacts[0]"),
    ("two-artifacts-no-paging", _set("artifacts", ["model.xml", "model.bin"]), "paging"),
    ("inputs-empty", _set("inputs", []), "inputs"),
    ("outputs-empty", _set("outputs", []), "outputs"),
    ("input-dtype-object", _set("inputs.0.dtype", "object"), "dtype"),
    ("input-dtype-nonsense", _set("inputs.0.dtype", "float99"), "dtype"),
    ("input-negative-dim", _set("inputs.0.shape", [-1, 16]), "inputs.0.shape"),
    ("input-huge-dim", _set("inputs.0.shape", [10**12, 16]), "inputs.0.shape"),
    ("input-shape-string", _set("inputs.0.shape", "2x16"), "inputs.0.shape"),
    ("input-name-number", _set("inputs.0.name", 5), "inputs.0.name"),
    ("input-missing-name", _set("inputs.0.name", ...), "inputs.0.name"),
    ("output-twice", lambda d: d["outputs"].append(d["outputs"][0]), "twice"),
    ("backend-string", _set("backend", "openvino"), "backend"),
    ("backend-empty-name", _set("backend.name", ""), "backend.name"),
    ("backend-versions-number", _set("backend.versions", {"toolkit": 3}), "backend.versions"),
    ("schema-unknown", _set("schema", "edgeinfer.bundle/99"), "unsupported manifest schema"),
    ("files-missing", _set("files", ...), "deploy the model again"),
    ("files-list", _set("files", []), "files"),
    ("files-bad-sha", lambda d: d["files"]["model.bin"].update(sha256="zz"), "sha256"),
    ("files-negative-size", lambda d: d["files"]["model.bin"].update(size=-5), "size"),
    ("files-dotdot", lambda d: d["files"].update({"../outside.bin": d["files"]["model.bin"]}), "files["),
    ("files-absolute", lambda d: d["files"].update({"/etc/hostname": d["files"]["model.bin"]}), "absolute"),
    ("golden-threshold-string", _set("golden.threshold", "high"), "golden.threshold"),
    ("golden-threshold-nan", _set("golden.threshold", float("nan")), "golden.threshold"),
    ("golden-threshold-out-of-range", _set("golden.threshold", 5), "golden.threshold"),
    ("golden-threshold-bool", _set("golden.threshold", True), "golden.threshold"),
    ("golden-passed-string", _set("golden.passed", "yes"), "golden.passed"),
    ("paging-window-zero", _set("paging", {"window": 0}), "paging.window"),
    ("paging-unknown-key", _set("paging", {"window": 2, "evil": 1}), "paging.evil"),
    ("paging-string", _set("paging", "yes"), "paging"),
    ("unknown-top-level-field", _set("evil", 1), "unknown field"),
    ("board-number", _set("board", 7), "board"),
]


@pytest.mark.parametrize("case,change,needle", PLAIN_FIELDS, ids=[c[0] for c in PLAIN_FIELDS])
def test_manifest_field_is_refused(deployed, x_npy, tmp_path, case, change, needle):
    bundle = _copy(deployed, tmp_path)
    _edit(bundle, change)
    before = _files(tmp_path)
    _check_refused(_run_plain(bundle, x_npy, tmp_path), tmp_path, before, needle)


# --- manifest fields (text bundle) --------------------------------------------------------------------

TEXT_FIELDS = [
    ("max-length-huge", _set("text.max_length", 10**12), "text.max_length"),
    ("max-length-negative", _set("text.max_length", -1), "text.max_length"),
    ("max-length-zero", _set("text.max_length", 0), "text.max_length"),
    ("max-length-string", _set("text.max_length", "128"), "text.max_length"),
    ("max-length-float", _set("text.max_length", 12.5), "text.max_length"),
    ("max-length-bool", _set("text.max_length", True), "text.max_length"),
    ("output-unknown", _set("text.output", "pooler_output"), "text.output"),
    ("pooling-unknown", _set("text.pooling", "max"), "text.pooling"),
    ("normalize-string", _set("text.normalize", "yes"), "text.normalize"),
    ("tokenizer-dotdot", _set("text.tokenizer", "../tokenizer"), "text.tokenizer"),
    ("tokenizer-absolute", _set("text.tokenizer", "/tmp"), "text.tokenizer"),
    ("text-not-object", _set("text", "yes"), "text"),
    ("mean-pooling-without-mask", lambda d: d["inputs"].pop(1), "attention_mask"),
    ("input-not-from-text", _set("inputs.1.name", "pixel_values"), "pixel_values"),
]


@pytest.mark.parametrize("case,change,needle", TEXT_FIELDS, ids=[c[0] for c in TEXT_FIELDS])
def test_text_manifest_field_is_refused(text_bundle, tmp_path, case, change, needle):
    bundle = _copy(text_bundle, tmp_path)
    _edit(bundle, change)
    before = _files(tmp_path)
    _check_refused(_run_text(bundle, tmp_path), tmp_path, before, needle)


def test_text_bundle_as_built_runs(text_bundle, tmp_path):
    """The corpus's text bundle is valid: refusals above come from the one change each made."""
    proc = cli("run", str(text_bundle), "--text", "hello world", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["outputs"][0]["name"] == "last_hidden_state"


# --- the manifest file itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case,text,needle",
    [
        ("garbage", "this is not json {", "not valid JSON"),
        ("json-list", "[1, 2, 3]", "unsupported manifest schema"),
        ("deep-nesting", "[" * 200_000, "not valid JSON"),
        ("empty", "", "not valid JSON"),
    ],
)
def test_unreadable_manifest_is_refused(deployed, x_npy, tmp_path, case, text, needle):
    bundle = _copy(deployed, tmp_path)
    (bundle / "manifest.json").write_text(text)
    before = _files(tmp_path)
    _check_refused(_run_plain(bundle, x_npy, tmp_path), tmp_path, before, needle)


def test_manifest_symlinked_outside_is_refused(deployed, x_npy, tmp_path):
    bundle = _copy(deployed, tmp_path)
    outside = tmp_path / "elsewhere.json"
    (bundle / "manifest.json").rename(outside)
    (bundle / "manifest.json").symlink_to(outside)
    before = _files(tmp_path)
    _check_refused(_run_plain(bundle, x_npy, tmp_path), tmp_path, before, "outside the bundle")


# --- symlinks out of the bundle ------------------------------------------------------------------------


def test_artifact_symlinked_outside_is_refused(deployed, x_npy, tmp_path):
    """Same bytes, same size, but the file lives outside: refused by path, not by content."""
    bundle = _copy(deployed, tmp_path)
    outside = tmp_path / "outside.bin"
    (bundle / "model.bin").rename(outside)
    (bundle / "model.bin").symlink_to(outside)
    before = _files(tmp_path)
    _check_refused(_run_plain(bundle, x_npy, tmp_path), tmp_path, before, "outside the bundle")


def test_tokenizer_dir_symlinked_outside_is_refused(text_bundle, tmp_path):
    bundle = _copy(text_bundle, tmp_path)
    outside = tmp_path / "tok-elsewhere"
    (bundle / "tokenizer").rename(outside)
    (bundle / "tokenizer").symlink_to(outside, target_is_directory=True)
    before = _files(tmp_path)
    _check_refused(_run_text(bundle, tmp_path), tmp_path, before, "outside the bundle")


# --- changed, truncated and missing files -------------------------------------------------------------


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-1])


def _flip_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _append(p: Path) -> None:
    p.write_bytes(p.read_bytes() + b"\0")


SIZE_CHANGES = [
    ("model-bin-truncated", "model.bin", _truncate),
    ("model-bin-missing", "model.bin", Path.unlink),
    ("model-xml-grown", "model.xml", _append),
    ("stamp-truncated", "model.xml.stamp.json", _truncate),
    ("golden-inputs-missing", "golden/inputs.npz", Path.unlink),
    ("golden-expected-truncated", "golden/expected.npz", _truncate),
]


@pytest.mark.parametrize("case,rel,change", SIZE_CHANGES, ids=[c[0] for c in SIZE_CHANGES])
def test_changed_size_is_refused_on_every_open(deployed, x_npy, tmp_path, case, rel, change):
    bundle = _copy(deployed, tmp_path)
    change(bundle / rel)
    before = _files(tmp_path)
    _check_refused(_run_plain(bundle, x_npy, tmp_path), tmp_path, before, rel)


@pytest.mark.parametrize("rel", ["model.bin", "golden/expected.npz", "model.xml"])
@pytest.mark.parametrize("command", ["golden", "verify"])
def test_same_size_change_is_caught_by_the_full_hash(deployed, tmp_path, rel, command):
    bundle = _copy(deployed, tmp_path)
    _flip_byte(bundle / rel)
    before = _files(tmp_path)
    proc = cli(command, str(bundle))
    _refused(proc, rel if command == "golden" else "damaged")
    if command == "verify":
        assert rel in proc.stdout  # the listing names the file
    assert _files(tmp_path) == before


def test_text_tokenizer_truncated_is_refused(text_bundle, tmp_path):
    bundle = _copy(text_bundle, tmp_path)
    _truncate(bundle / "tokenizer" / "tokenizer.json")
    before = _files(tmp_path)
    _check_refused(_run_text(bundle, tmp_path), tmp_path, before, "tokenizer/tokenizer.json")


# --- verify ---------------------------------------------------------------------------------------------


def test_verify_passes_a_deployed_bundle_and_counts_its_files(deployed):
    proc = cli("verify", str(deployed), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    expected = sorted(p.relative_to(deployed).as_posix() for p in deployed.rglob("*")
                      if p.is_file() and p.name != "manifest.json")
    assert report["ok"] is True and report["problems"] == []
    assert report["files"] == len(expected) == 5  # model.xml, model.bin, stamp, golden inputs + expected
    assert report["bytes"] == sum((deployed / r).stat().st_size for r in expected)


def test_verify_lists_every_damaged_file(deployed, tmp_path):
    bundle = _copy(deployed, tmp_path)
    _flip_byte(bundle / "model.bin")
    (bundle / "golden" / "inputs.npz").unlink()
    _truncate(bundle / "model.xml.stamp.json")
    proc = cli("verify", str(bundle), "--json")
    _refused(proc, "3 files differ")
    problems = json.loads(proc.stdout)["problems"]
    assert sorted(p.split()[0] for p in problems) == ["golden/inputs.npz", "model.bin", "model.xml.stamp.json"]


def test_verify_refuses_a_path_escape_with_one_line(deployed, tmp_path):
    bundle = _copy(deployed, tmp_path)
    _edit(bundle, _set("artifacts", ["../x.xml"]))
    _refused(cli("verify", str(bundle)), "artifacts[0]")


# --- every command that opens a bundle -------------------------------------------------------------------


@pytest.mark.parametrize("command", [["golden"], ["bench", "--batch", "2", "--repeat", "1"], ["verify"],
                                     ["serve", "--port", "0"]])
def test_every_command_refuses_a_bundle_pointing_outside(deployed, tmp_path, command):
    bundle = _copy(deployed, tmp_path)
    (tmp_path / "model.xml").write_bytes((bundle / "model.xml").read_bytes())
    _edit(bundle, _set("artifacts", ["../model.xml"]))
    before = _files(tmp_path)
    proc = cli(command[0], str(bundle), *command[1:])
    _check_refused(proc, tmp_path, before, "artifacts[0]")


def test_deployed_bundle_as_built_runs_and_passes_golden(deployed, x_npy, tmp_path):
    """The corpus's plain bundle is valid: run and the fully hashed golden check both succeed."""
    run = _run_plain(deployed, x_npy, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "out" / "y.npy").is_file()
    golden = cli("golden", str(deployed), "--json")
    assert golden.returncode == 0, golden.stderr[-2000:]
    assert json.loads(golden.stdout)["passed"] is True


def test_deployed_manifest_matches_the_published_schema(deployed):
    import jsonschema

    from edgeinfer.model import bundle as bundle_mod

    schema = json.loads((Path(bundle_mod.__file__).parents[1] / "schemas" / "manifest.schema.json").read_text())
    manifest = json.loads((deployed / "manifest.json").read_text())
    jsonschema.validate(manifest, schema)
    assert set(manifest["files"]) == {"model.xml", "model.bin", "model.xml.stamp.json", "golden/inputs.npz",
                                      "golden/expected.npz"}
    bad = {**manifest, "artifacts": ["../../elsewhere/model.xml"]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_runtime_logs_are_not_sealed(deployed, x_npy, tmp_path):
    """Backends append to *.log next to their artifact while running (RKNN): that must not break the seal."""
    bundle = _copy(deployed, tmp_path)
    (bundle / "model.xml.log").write_text("a runtime log line\n")
    proc = _run_plain(bundle, x_npy, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert cli("verify", str(bundle)).returncode == 0
    (bundle / "model.xml.log").write_text("grown\n" * 100)
    assert cli("verify", str(bundle)).returncode == 0


# --- files the manifest does not record, symlinks ------------------------------------------------------


def _one_error_line(proc, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_verify_lists_unrecorded_files_exits_1_and_reseal_records_them(deployed, tmp_path):
    bundle = _copy(deployed, tmp_path)
    (bundle / "golden" / "notes.txt").write_text("added after deploy\n")
    (bundle / "alias.bin").symlink_to("model.bin")  # inside the bundle, but never sealed
    proc = cli("verify", str(bundle), "--json")
    line = _one_error_line(proc, 1)
    assert "2 files its manifest does not record" in line and f"edgeinfer verify {bundle} --reseal" in line
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["problems"] == [] and report["outside_links"] == []
    assert report["unrecorded"] == ["alias.bin (symlink)", "golden/notes.txt"]

    proc = cli("verify", str(bundle), "--reseal", "--json")
    assert proc.returncode == 1, proc.stderr  # the symlink is still not recorded: it never is
    report = json.loads(proc.stdout)
    assert report["resealed"] == ["golden/notes.txt"] and report["unrecorded"] == ["alias.bin (symlink)"]
    (bundle / "alias.bin").unlink()
    proc = cli("verify", str(bundle))
    assert proc.returncode == 0, proc.stderr
    assert "golden/notes.txt" in json.loads((bundle / "manifest.json").read_text())["files"]


def test_reseal_never_hides_a_damaged_file(deployed, tmp_path):
    bundle = _copy(deployed, tmp_path)
    (bundle / "extra.txt").write_text("x")
    raw = bytearray((bundle / "model.bin").read_bytes())
    raw[0] ^= 0xFF
    (bundle / "model.bin").write_bytes(bytes(raw))
    proc = cli("verify", str(bundle), "--reseal", "--json")
    assert "damaged" in _one_error_line(proc, 2)
    assert json.loads(proc.stdout)["resealed"] == []
    assert "extra.txt" not in json.loads((bundle / "manifest.json").read_text())["files"]


@pytest.mark.parametrize("where", ["golden/etc", "etc"])
def test_a_symlink_out_of_the_bundle_fails_verify_and_every_open(deployed, x_npy, tmp_path, where):
    """``golden/etc -> /etc``: nothing the manifest names goes through it, yet a runtime opening files in the
    bundle could; verify (exit 2) and every command that opens the bundle refuse it in one line."""
    bundle = _copy(deployed, tmp_path)
    (bundle / where).symlink_to("/etc")
    proc = cli("verify", str(bundle), "--json")
    assert f"{where} -> /etc" in _one_error_line(proc, 2)
    assert json.loads(proc.stdout)["outside_links"] == [f"{where} -> /etc"]
    for proc in (_run_plain(bundle, x_npy, tmp_path), cli("golden", str(bundle))):
        assert "symlink that leads out of it" in _refused(proc, f"{where} -> /etc")
    assert not (tmp_path / "out").exists()
