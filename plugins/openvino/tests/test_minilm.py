"""all-MiniLM-L6-v2 through OpenVINO vs onnxruntime fp32: cosine of mean-pooled sentence embeddings
on 40 held-out sentences (int8 calibrated on 120 other real sentences)."""

import numpy as np
import pytest

import edgeinfer
from edgeinfer.contract import CalibrationSet
from edgeinfer.testing import minilm

pytestmark = pytest.mark.slow

THRESHOLD = {"fp32": 0.999, "fp16": 0.999, "w8a8": 0.99, "w8a16": 0.99}


@pytest.fixture(scope="module")
def heldout():
    return minilm.tokenize(minilm.heldout_sentences(40))


@pytest.fixture(scope="module")
def reference(minilm_onnx, heldout):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(minilm_onnx), providers=["CPUExecutionProvider"])
    return minilm.mean_pool(sess.run(["last_hidden_state"], heldout)[0], heldout["attention_mask"])


@pytest.fixture(scope="module")
def calibration():
    cal = minilm.tokenize(minilm.calibration_sentences(120))
    assert not set(minilm.calibration_sentences(120)) & set(minilm.heldout_sentences(40))
    return CalibrationSet([{k: v[i : i + 1] for k, v in cal.items()} for i in range(120)])


@pytest.fixture(scope="module")
def artifacts(minilm_onnx, calibration, module_tmp):
    be = edgeinfer.backend("openvino")
    root = module_tmp
    return {
        s: be.quantize(minilm_onnx, s, calibration if s == "w8a8" else None, root / f"minilm-{s}.xml")
        for s in THRESHOLD
    }


@pytest.mark.parametrize("scheme", list(THRESHOLD))
def test_embeddings_match_onnxruntime_fp32(artifacts, heldout, reference, scheme):
    be = edgeinfer.backend("openvino")
    with be.load(artifacts[scheme], device="CPU") as s:
        hidden = s.run(heldout)["last_hidden_state"]
    assert hidden.shape == (40, 128, 384)
    cos = minilm.cosine(minilm.mean_pool(hidden, heldout["attention_mask"]), reference)
    assert cos.min() >= THRESHOLD[scheme], f"{scheme}: min cosine {cos.min():.5f}, mean {cos.mean():.5f}"


def test_int8_stamp_records_the_calibration(artifacts):
    from edgeinfer.contract import stamp

    data = stamp.read(artifacts["w8a8"])
    assert data["calibration_samples"] == 120 and data["model_type"] == "transformer"
    assert data["inputs"][0] == {"name": "input_ids", "shape": ["batch", "sequence"], "dtype": "int64"}


def test_quantized_irs_are_smaller(artifacts):
    size = {s: p.with_suffix(".bin").stat().st_size for s, p in artifacts.items()}
    assert size["fp16"] < 0.6 * size["fp32"]
    assert size["w8a16"] < 0.35 * size["fp32"] and size["w8a8"] < 0.35 * size["fp32"]


def test_run_many_batch1_equals_one_batched_run(artifacts, heldout):
    be = edgeinfer.backend("openvino")
    singles = [{k: v[i : i + 1] for k, v in heldout.items()} for i in range(8)]
    with be.load(artifacts["fp32"], device="CPU", hint="THROUGHPUT") as s:
        many = s.run_many(singles)
        batched = s.run({k: v[:8] for k, v in heldout.items()})["last_hidden_state"]
    stacked = np.concatenate([m["last_hidden_state"] for m in many])
    np.testing.assert_allclose(stacked, batched, rtol=1e-3, atol=1e-3)


def test_npu_target_static_shapes_from_options(minilm_onnx, heldout, reference, tmp_path):
    """What an NPU build gets: static [1, 128] shapes, fp16 weights; checked on the CPU here."""
    be = edgeinfer.backend("openvino")
    shapes = {n: [1, 128] for n in ("input_ids", "attention_mask", "token_type_ids")}
    out = be.quantize(minilm_onnx, "fp16", None, tmp_path / "minilm-npu.xml", target="npu", shapes=shapes)
    with be.load(out, device="CPU") as s:
        assert all(i.shape == (1, 128) for i in s.inputs)
        outs = s.run_many([{k: v[i : i + 1] for k, v in heldout.items()} for i in range(4)])
    hidden = np.concatenate([o["last_hidden_state"] for o in outs])
    cos = minilm.cosine(minilm.mean_pool(hidden, heldout["attention_mask"][:4]), reference[:4])
    assert cos.min() >= 0.999


def test_run_many_then_close_repeatedly_does_not_hang(artifacts):
    """Regression: with a Python callback on the AsyncInferQueue (and shared inputs), destroying the
    compiled model while a worker thread waited for the GIL deadlocked the process (seen on 2 cores)."""
    import subprocess
    import sys

    code = f"""
import edgeinfer
from edgeinfer.testing import minilm
be = edgeinfer.backend("openvino")
b = minilm.tokenize(list(minilm.sentences()[-8:]))
singles = [{{k: v[i:i + 1] for k, v in b.items()}} for i in range(8)]
for _ in range(4):
    with be.load({str(artifacts["w8a16"])!r}, device="CPU", hint="THROUGHPUT") as s:
        s.run_many(singles)
        s.run_many(singles)
print("done")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("done"), proc.stderr[-2000:]
