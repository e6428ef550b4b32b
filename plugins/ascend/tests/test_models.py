"""Model inputs: HF directory / weights file / torch.export program; no pickle; ONNX refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from edgeinfer.errors import InputError, ModelError
from edgeinfer.testing import minilm


class NotATensor:
    def __init__(self):
        self.payload = "arbitrary object"


def _hf_copy(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    shutil.copy(minilm.model_dir() / "config.json", d / "config.json")
    return d


def test_onnx_is_refused_with_the_right_input(ascend, tmp_path):
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"not even onnx")
    with pytest.raises(ModelError) as err:
        ascend.quantize(onnx, "fp32", None, tmp_path / "out.ascend")
    msg = err.value.one_line()
    assert "Hugging Face model directory" in msg and ".pt2" in msg and "--backend onnxruntime" in msg
    assert not (tmp_path / "out.ascend").exists()


def test_pickle_with_objects_is_refused(ascend, tmp_path):
    d = _hf_copy(tmp_path)
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2), "extra": NotATensor()},
               d / "pytorch_model.bin")
    with pytest.raises(ModelError, match="pickled Python objects.*weights_only=True"):
        ascend.quantize(d / "pytorch_model.bin", "fp32", None, tmp_path / "out.ascend")
    assert not (tmp_path / "out.ascend").exists()


def test_weights_without_config_are_refused(ascend, tmp_path):
    f = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, f)
    with pytest.raises(ModelError, match="config.json"):
        ascend.quantize(f, "fp32", None, tmp_path / "out.ascend")


@pytest.mark.slow
def test_dataparallel_prefix_is_stripped(ascend, tmp_path, minilm_artifacts, heldout_feeds):
    from safetensors.torch import load_file

    d = _hf_copy(tmp_path)
    state = load_file(str(minilm.model_dir() / "model.safetensors"))
    torch.save({"module." + k: v for k, v in state.items()}, d / "pytorch_model.bin")  # nn.DataParallel layout
    art = ascend.quantize(d / "pytorch_model.bin", "fp32", None, tmp_path / "dp.ascend")
    feeds = {k: v[:4] for k, v in heldout_feeds.items()}
    with ascend.load(art, warmup=False) as s, ascend.load(minilm_artifacts("fp32"), warmup=False) as ref:
        np.testing.assert_array_equal(s.run(feeds)["last_hidden_state"], ref.run(feeds)["last_hidden_state"])


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 8)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.relu(self.a(x)), torch.softmax(self.b(x), dim=-1)


def test_torch_export_program(ascend, tmp_path):
    m = TwoHeads().eval()
    x = torch.randn(3, 16)
    pt2 = tmp_path / "two.pt2"
    torch.export.save(torch.export.export(m, (x,)), str(pt2))
    art = ascend.quantize(pt2, None, None, tmp_path / "two.ascend")
    with ascend.load(art) as s:
        assert [i.name for i in s.inputs] == ["x"] and s.inputs[0].shape == (3, 16)
        assert [o.name for o in s.outputs] == ["output_0", "output_1"]
        got = s.run({"x": x.numpy()})
    with torch.no_grad():
        want = [t.numpy() for t in m(x)]
    np.testing.assert_allclose(got["output_0"], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["output_1"], want[1], rtol=1e-6, atol=1e-6)
    stamp = json.loads((tmp_path / "two.ascend.stamp.json").read_text())
    assert stamp["backend"] == "ascend" and stamp["kind"] == "export"
    with pytest.raises(InputError, match="Linear layers"):
        ascend.quantize(pt2, "w8a16", None, tmp_path / "two-int8.ascend")


def test_not_an_artifact_is_refused(ascend, tmp_path):
    bad = tmp_path / "x.ascend"
    bad.write_bytes(b"garbage")
    with pytest.raises(InputError, match="not an ascend artifact"):
        ascend.load(bad)


def test_unknown_options_are_named(ascend, minilm_artifacts):
    with pytest.raises(InputError, match="bogus"):
        ascend.load(minilm_artifacts("fp32"), bogus=1)
    with pytest.raises(InputError, match="npu"):
        ascend.load(minilm_artifacts("fp32"), device="tpu")
