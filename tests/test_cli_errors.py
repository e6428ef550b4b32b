"""Exit codes and ``--json`` error objects that a script can rely on (README "Exit codes"), through the CLI in
this process, with a deliberately broken third-party plugin (tests/broken_plugin: a distribution with entry
points in the ``edgeinfer`` group, put on the path as an installed one is) whose ``EDGEINFER_BROKEN_MODE``
picks how it misbehaves."""

from __future__ import annotations

import json
import re
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from edgeinfer import errors
from edgeinfer.testing import models
from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()

PLUGIN = Path(__file__).resolve().parent / "broken_plugin"
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The broken plugin installed (on sys.path, plugins discovered again), a conversion cache of this module's
    own, a tiny ONNX model with a dynamic batch and an input for it, and a bundle deployed for the plugin's
    board while the plugin still works."""
    from edgeinfer.contract import registry
    from edgeinfer.deploy.encoder import deploy

    root = tmp_path_factory.mktemp("errors")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(PLUGIN))
        mp.setenv("EDGEINFER_CACHE_DIR", str(root / "cache"))
        mp.delenv("EDGEINFER_PLUGINS", raising=False)
        mp.delenv("EDGEINFER_BROKEN_MODE", raising=False)
        registry.reset()
        try:
            model = models.mlp(root, batch="batch")
            np.save(root / "x.npy", model.feeds["x"])
            deploy(model.path, "broken-board", root / "bundle", quant="fp32")
            yield root
        finally:
            registry.reset()
    sys.modules.pop("edgeinfer_broken", None)


def _error(proc, code: int, kind: str) -> str:
    """The one JSON error object on stdout and the one line on stderr of a failed command; its message."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    obj = json.loads(proc.stdout)  # exactly one JSON document: json.loads refuses anything after it
    assert set(obj) == {"error"} and set(obj["error"]) == {"code", "kind", "message"}, obj
    assert obj["error"]["code"] == code and obj["error"]["kind"] == kind, obj
    assert errors.KINDS[kind] == code or (kind, code) == ("interrupted", 143)  # KINDS holds SIGINT's 130
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == f"error: {obj['error']['message']}", proc.stderr
    return obj["error"]["message"]


def _run(w: Path, *extra: str, mode: str = "ok", model: str = "mlp_dynamic.onnx", env=None):
    return cli("run", str(w / model), "--backend", "broken", "--input", f"x={w / 'x.npy'}", "--json", *extra,
               env={"EDGEINFER_BROKEN_MODE": mode, **(env or {})})


# --- the plugin-call boundary -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("mode", "says"), [
    ("open", "RuntimeError: NPU device lost (vendor error 0x2a) (in open mlp_dynamic.brk)"),
    ("infer", "ZeroDivisionError: division by zero (in infer)"),
    ("shapes", "its session returned output 'y' with shape [3, 3], declared [batch, 8]"),
    ("dtype", "its session returned output 'y' as float64, declared float32"),
    ("empty", "its session returned no output 'y' (declared: y; returned: none)"),
    ("none", "its session returned NoneType, not a mapping of output name to array"),
    ("extra", "its session returned output 'debug_tensor', which it does not declare (declared: y)"),
])
def test_what_a_plugin_raises_or_returns_wrong_is_exit_3_naming_it(work, mode, says):
    message = _error(_run(work, mode=mode), 3, "plugin_failed")
    assert message.startswith(f"backend 'broken' failed: {says}"), message


def test_a_plugin_that_works_runs(work):
    proc = _run(work)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outputs"] == [{"name": "y", "shape": [3, 8], "dtype": "float32", "non_finite": 0}]


def test_a_crash_in_convert_is_exit_3_and_leaves_no_artifact(work, tmp_path):
    message = _error(_run(work, mode="convert", env={"EDGEINFER_CACHE_DIR": str(tmp_path)}), 3, "plugin_failed")
    assert message.startswith("backend 'broken' failed: ValueError: vendor compiler crashed"), message
    assert not list(tmp_path.rglob("*.brk"))


def test_a_plugin_saying_bad_input_on_purpose_keeps_exit_2(work):
    message = _error(_run(work, mode="refuses"), 2, "bad_input")
    assert message == "mlp_dynamic.brk was compiled for another NPU; convert it again for this one"


def test_a_module_a_plugin_imports_at_use_and_cannot_find_is_package_missing(work):
    message = _error(_run(work, mode="package"), 3, "package_missing")
    assert "'edgeinfer_broken_vendor_runtime' is not installed" in message


def test_a_plugin_that_fails_at_import_makes_its_backend_unavailable_naming_the_distribution(work):
    proc = cli("run", str(work / "mlp_dynamic.onnx"), "--backend", "broken_import", "--input",
               f"x={work / 'x.npy'}", "--json")
    message = _error(proc, 3, "backend_unavailable")
    assert "distribution edgeinfer-broken" in message and "libbroken_npu.so" in message, message


def test_golden_through_a_broken_plugin(work):
    message = _error(cli("golden", str(work / "bundle"), "--json", env={"EDGEINFER_BROKEN_MODE": "shapes"}), 3,
                     "plugin_failed")
    assert "output 'y' with shape [3, 3]" in message
    for mode in ("open", "empty"):  # "empty" was golden's internal error KeyError: 'y' (exit 3, blaming the core)
        _error(cli("golden", str(work / "bundle"), "--json", env={"EDGEINFER_BROKEN_MODE": mode}), 3,
               "plugin_failed")
    # wrong values in the right form: a negative verdict, printed as golden's own report
    wrong = cli("golden", str(work / "bundle"), "--json", env={"EDGEINFER_BROKEN_MODE": "wrong"})
    assert wrong.returncode == 1, wrong.stderr
    report = json.loads(wrong.stdout)
    assert report["passed"] is False and "error" not in report


# --- one case per kind: every kind of errors.KINDS under --json -----------------------------------------------

@dataclass
class Case:
    kind: str
    args: tuple[str, ...]  # {w}: the module's work directory
    mode: str = "ok"


CASES = [
    Case("bad_input", ("run", "--json")),
    Case("bad_input", ("run", "{w}/mlp_dynamic.onnx", "--input", "x", "--json")),
    Case("model_not_found", ("run", "{w}/nosuch.onnx", "--input", "x={w}/x.npy", "--json")),
    Case("model_invalid", ("run", "{w}/garbage.onnx", "--input", "x={w}/x.npy", "--json")),
    Case("not_supported", ("deploy", "{w}/mlp_dynamic.onnx", "--board", "broken-board", "--quant", "int8", "-o",
                           "{w}/out-int8", "--json")),
    Case("bundle_missing", ("verify", "{w}/nosuch-bundle", "--json")),
    Case("bundle_missing", ("golden", "{w}/nosuch-bundle", "--json")),
    Case("bundle_missing", ("golden", "{w}", "--json")),  # a directory, but no bundle
    Case("bundle_damaged", ("run", "{w}/damaged", "--input", "x={w}/x.npy", "--json")),
    Case("unknown_board", ("deploy", "{w}/mlp_dynamic.onnx", "--board", "nosuch-board", "-o", "{w}/out-nb",
                           "--json")),
    Case("does_not_fit", ("deploy", "{w}/mlp_dynamic.onnx", "--board", "broken-tiny-board", "--quant", "fp32",
                          "-o", "{w}/out-tiny", "--json")),
    Case("golden_failed", ("deploy", "{w}/mlp_dynamic.onnx", "--board", "broken-board", "--quant", "fp32", "-o",
                           "{w}/out-wrong", "--no-cache", "--json"), mode="wrong"),
    Case("plugin_failed", ("deploy", "{w}/mlp_dynamic.onnx", "--board", "broken-board", "--quant", "fp32", "-o",
                           "{w}/out-shapes", "--no-cache", "--json"), mode="shapes"),
    Case("backend_unavailable", ("run", "{w}/mlp_dynamic.onnx", "--backend", "nosuch", "--input", "x={w}/x.npy",
                                 "--json")),
    Case("package_missing", ("run", "{w}/mlp_dynamic.onnx", "--backend", "broken", "--input", "x={w}/x.npy",
                             "--json"), mode="package"),
]
# port_in_use, internal_error and interrupted have tests of their own below
SEPARATE = {"port_in_use", "internal_error", "interrupted"}


def test_every_kind_has_a_case():
    assert {c.kind for c in CASES} | SEPARATE == set(errors.KINDS)


@pytest.fixture(scope="module")
def prepared(work):
    (work / "garbage.onnx").write_bytes(b"this is not a protobuf")
    damaged = work / "damaged"
    if not damaged.exists():
        shutil.copytree(work / "bundle", damaged)
        artifact = next(damaged.glob("*.brk"))
        artifact.write_bytes(artifact.read_bytes()[:-1])
    return work


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.kind}-{c.args[0]}")
def test_kind_under_json(prepared, case):
    args = [a.format(w=prepared) for a in case.args]
    _error(cli(*args, env={"EDGEINFER_BROKEN_MODE": case.mode}), errors.KINDS[case.kind], case.kind)
    assert not any((prepared / d).exists() for d in ("out-int8", "out-nb", "out-tiny", "out-wrong", "out-shapes"))


def test_negative_plan_verdict_prints_the_plan_not_an_error(work):
    proc = cli("plan", str(work / "mlp_dynamic.onnx"), "--board", "broken-tiny-board", "--quant", "fp32", "--json")
    assert proc.returncode == 1, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["fits"] is False and "error" not in plan


def test_port_in_use(work):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        message = _error(cli("serve", str(work / "bundle"), "--port", str(port), "--json"), 2, "port_in_use")
    assert f"cannot listen on 127.0.0.1:{port}" in message


@pytest.mark.parametrize(("raised", "code", "kind", "says"), [
    (KeyError("y"), 3, "internal_error",
     "internal error KeyError: 'y' (rerun with --debug for the traceback and report it)"),
    (KeyboardInterrupt(), 130, "interrupted", "interrupted (SIGINT); nothing was left behind"),
    (errors.Interrupted(15), 143, "interrupted", "interrupted (SIGTERM); nothing was left behind"),
])
def test_internal_errors_and_interrupts_under_json(monkeypatch, tmp_path, raised, code, kind, says):
    import edgeinfer.run.once

    def boom(*args, **kwargs):
        raise raised

    monkeypatch.setattr(edgeinfer.run.once, "run_once", boom)
    assert _error(cli("run", str(tmp_path / "m.onnx"), "--json"), code, kind) == says


def test_without_json_stdout_stays_empty(work):
    proc = cli("verify", str(work / "nosuch-bundle"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"error: bundle not found: {work / 'nosuch-bundle'}"


# --- the README holds the same table ------------------------------------------------------------------------

def test_readme_error_kind_table_matches_kinds():
    text = README.read_text()
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([0-9 /]+) \|", text, flags=re.M))
    documented = {k: v.strip() for k, v in rows.items()}
    assert set(documented) == set(errors.KINDS)
    for kind, code in errors.KINDS.items():
        want = "130 / 143" if kind == "interrupted" else str(code)
        assert documented[kind] == want, kind
    codes = set(re.findall(r"^\| (\d+(?: / \d+)?) \| ", text[text.index("## Exit codes"):], flags=re.M))
    assert {"0", "1", "2", "3", "130 / 143"} <= codes


# --- the boundary itself, for the calls the CLI cases above do not reach (decoders) -----------------------------

def test_plugin_call_keeps_errors_raised_on_purpose_and_blames_the_plugin_for_the_rest():
    from edgeinfer.contract.boundary import plugin_call

    def raising(e):
        def fn(*args):
            raise e
        return fn

    on_purpose = errors.ModelError("m.bin is for another NPU")
    with pytest.raises(errors.ModelError) as kept:
        plugin_call("npu", "open m.bin", raising(on_purpose))
    assert kept.value is on_purpose and kept.value.exit_code == 2
    with pytest.raises(errors.BackendError) as failed:
        plugin_call("npu", "decoder prefill", raising(RuntimeError("kv cache overflow\nat step 3")), 0)
    assert failed.value.kind == "plugin_failed" and failed.value.exit_code == 3
    assert failed.value.message == "backend 'npu' failed: RuntimeError: kv cache overflow (in decoder prefill)"
    assert isinstance(failed.value.__cause__, RuntimeError)
    with pytest.raises(errors.BackendUnavailableError) as missing:
        plugin_call("npu", "generate", raising(ModuleNotFoundError("No module named 'openvino_genai'",
                                                                   name="openvino_genai")))
    assert missing.value.kind == "package_missing" and "'openvino_genai' is not installed" in missing.value.message
    with pytest.raises(errors.BackendUnavailableError) as broken:
        plugin_call("npu", "open m.bin", raising(ImportError("libnpu.so: undefined symbol")))
    assert broken.value.kind == "backend_unavailable" and "libnpu.so: undefined symbol" in broken.value.message
    with pytest.raises(KeyboardInterrupt):
        plugin_call("npu", "decoder decode", raising(KeyboardInterrupt()))
    assert plugin_call("npu", "infer", lambda a, b=0: a + b, 1, b=2) == 3
