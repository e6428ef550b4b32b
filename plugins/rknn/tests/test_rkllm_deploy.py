"""``edgeinfer deploy LLM --board rk3588-8g --runtime rkllm``: conversion with Rockchip's RKLLM toolkit.

The toolkit (x86_64 wheels, not on PyPI) is not installed here, so the tests put a STAND-IN ``rkllm``
package on PYTHONPATH (``rkllm_toolkit_standin/``: it records the calls and writes a file the stand-in
runtime loads), and run the bundle through the RKLLM binding against the STAND-IN ``librkllmrt.so``
(``rkllm_standin.c``). Neither is Rockchip's code: they check the wiring, not a conversion; expected
build arguments come from the vendor's export example and the board profile, not from the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from edgeinfer_rknn import rkllm

import edgeinfer
from edgeinfer.errors import InputError
from edgeinfer.testing.llm import model_dir

CTX = 256
TOOLKIT_STANDIN = Path(__file__).with_name("rkllm_toolkit_standin")  # holds the stand-in `rkllm`
CALIB = ["The licence grants permission to use the software.", "def main():"]  # one sample a line


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeinfer.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env})


@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("rkllm-deploy")
    calib = tmp / "calib.txt"
    calib.write_text("\n".join(CALIB) + "\n")
    log, out = tmp / "toolkit-calls.jsonl", tmp / "bundle"
    proc = _cli("deploy", str(model_dir()), "--board", "rk3588-8g", "--runtime", "rkllm", "--ctx", str(CTX),
                "--calib", str(calib), "-o", str(out), "--json",
                PYTHONPATH=os.pathsep.join(filter(None, [str(TOOLKIT_STANDIN), os.environ.get("PYTHONPATH")])),
                RKLLM_TOOLKIT_STANDIN_LOG=str(log), EDGEINFER_CACHE_DIR=str(tmp / "cache"))
    assert proc.returncode == 0, proc.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return {"bundle": out, "json": json.loads(proc.stdout), "stderr": proc.stderr, "calls": calls}


def test_deploy_calls_the_toolkit_with_the_scheme_board_and_calibration(deployed):
    calls = deployed["calls"]
    assert [c["call"] for c in calls] == ["load_huggingface", "build", "export_rkllm"]
    assert calls[0]["kwargs"] == {"model": str(model_dir()), "device": "cpu"}
    build = calls[1]["kwargs"]
    # rk3588 defaults to w8a8 (boards/rk3588-8g.yaml, runtime rkllm); the vendor example's RK3588 values
    assert (build["quantized_dtype"], build["target_platform"], build["num_npu_core"]) == ("W8A8", "RK3588", 3)
    assert build["do_quantization"] is True and build["optimization_level"] == 1
    assert build["quantized_algorithm"] == "normal" and build["max_context"] == CTX
    assert build["dataset_content"] == [{"input": t, "target": ""} for t in CALIB]
    assert calls[2]["kwargs"]["export_path"].endswith("/decoder/model.rkllm")


def test_the_bundle_holds_the_rkllm_file_and_says_runtime_rkllm_and_golden_not_run(deployed):
    b, r = deployed["bundle"], deployed["json"]
    m = json.loads((b / "manifest.json").read_text())
    assert {"decoder/model.rkllm", "decoder/config.json", "decoder.stamp.json"} <= set(m["files"])
    assert not any(f.startswith("golden/") or f.endswith("calibration.json") for f in m["files"])
    assert m["backend"]["name"] == "rknn" and m["scheme"] == "w8a8" and m["target"] == "rk3588"
    assert m["decoder"]["runtime"] == "rkllm" and m["decoder"]["golden_reference"] is None
    assert json.loads((b / "decoder.stamp.json").read_text())["runtime"] == "rkllm"
    assert m["plan"]["estimates"]["runtime"] == "rkllm"  # planned with the vendor-fitted rkllm constants
    g = m["decoder"]["golden"]
    assert g["ran"] is False and g["passed"] is None and "aarch64" in g["reason"]
    assert r["runtime"] == "rkllm" and r["golden"] == g
    assert "no golden check ran" in r["speed_check"]["skipped"]  # nothing was timed to compare with the plan
    assert "without a golden check" in deployed["stderr"]


def test_the_bundle_generates_through_the_rkllm_runtime_binding(deployed, standin_lib):
    prompt = "The licence grants"
    env = {rkllm.LIB_ENV: str(standin_lib)}
    proc = _cli("generate", str(deployed["bundle"]), "--prompt", prompt, "--max-new-tokens", "6", "--json", **env)
    assert proc.returncode == 0, proc.stderr
    # the stand-in runtime's rule (rkllm_standin.c): t1 = (Σ prompt ids · 31 + 7) mod V, t_k+1 = (t_k · 31 + 7) mod V
    from edgeinfer.run.generation.text import TextCodec

    ids, vocab = TextCodec(model_dir()).encode(prompt), 3072  # tiny-qwen3's tokens for the prompt; its vocab
    want, t = [], (sum(ids) * 31 + 7) % vocab
    for _ in range(6):
        want.append(t)
        t = (t * 31 + 7) % vocab
    assert json.loads(proc.stdout)["token_ids"] == want
    proc = _cli("bench", str(deployed["bundle"]), "--prompt-lengths", "8", "--new-tokens", "4", "--json", **env)
    assert proc.returncode == 0, proc.stderr
    bench = json.loads(proc.stdout)
    assert bench["backend"] == "rknn" and [r["new_tokens"] for r in bench["results"]] == [4]
    assert bench["self_check"]["runtime"] == "rkllm"  # predictions for the runtime the bundle was built for
    proc = _cli("golden", str(deployed["bundle"]), **env)
    assert proc.returncode == 2 and "golden check was not run at deploy" in proc.stderr, proc.stderr


def test_deploy_without_the_toolkit_exits_3_saying_how_to_get_it(tmp_path):
    out = tmp_path / "bundle"
    proc = _cli("deploy", str(model_dir()), "--board", "rk3588-8g", "--runtime", "rkllm", "--ctx", str(CTX),
                "-o", str(out), EDGEINFER_CACHE_DIR=str(tmp_path / "cache"))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 3 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "rkllm-toolkit" in lines[0] and "https://github.com/airockchip/rknn-llm" in lines[0]
    assert "x86_64" in lines[0] and not out.exists()


def test_runtime_on_a_model_that_is_not_a_decoder_exits_2(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"an encoder, never read: --runtime is refused first")
    proc = _cli("deploy", str(tmp_path / "model.onnx"), "--board", "rk3588-8g", "--runtime", "rkllm",
                "-o", str(tmp_path / "out"))
    assert proc.returncode == 2 and "--runtime applies to decoder (language) models" in proc.stderr, proc.stderr


@pytest.mark.parametrize("board, kwargs, needle", [
    ("rk3588-8g", {"runtime": "rkllmm"}, "board rk3588-8g runs decoders with rkllm, rknn"),
    ("host", {"runtime": "rkllm"}, "board host runs decoders with llama.cpp, onnxruntime"),
    ("rk3588-8g", {"runtime": "rkllm", "options": {"runtime": "rknn"}}, "disagree"),
    ("rk3588-8g", {"runtime": "rkllm", "quant": "fp16"},  # plan's line: the board lists no fp16 for rkllm
     r"board rk3588-8g does not support fp16 for decoder models \(supported schemes: rkllm: w8a8, w8a8_g128"),
])
def test_bad_runtimes_are_input_errors(tmp_path, board, kwargs, needle):
    from edgeinfer.deploy.decoder import deploy_decoder

    with pytest.raises(InputError, match=needle):
        deploy_decoder(model_dir(), board, tmp_path / "out", ctx=CTX, **kwargs)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options, needle", [({"runtime": "rkllmm"}, "runtime must be one of rknn, rkllm"),
                                             ({"runtime": "rkllm", "segments": 2}, "segments do not apply"),
                                             ({"runtime": "rkllm", "target": "rk3588"}, "RKLLM on rk3588 supports")])
def test_the_backend_option_runtime_is_checked(tmp_path, options, needle):
    with pytest.raises(InputError, match=needle):
        edgeinfer.backend("rknn").quantize_decoder(model_dir(), "fp16", CTX, tmp_path / "d", **options)


def test_a_failing_toolkit_step_is_named_and_leaves_nothing(tmp_path, monkeypatch):
    from edgeinfer.errors import BackendError

    monkeypatch.syspath_prepend(str(TOOLKIT_STANDIN))
    monkeypatch.setenv("RKLLM_TOOLKIT_STANDIN_FAIL", "build")
    for name in ("rkllm", "rkllm.api"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        with pytest.raises(BackendError, match=r"RKLLM toolkit build failed \(code -1\) for tiny-qwen3"):
            edgeinfer.backend("rknn").quantize_decoder(model_dir(), "w8a8", CTX, tmp_path / "d", runtime="rkllm")
        assert not (tmp_path / "d").exists()
    finally:
        for name in ("rkllm", "rkllm.api"):  # the stand-in must not stay importable for other tests
            sys.modules.pop(name, None)
