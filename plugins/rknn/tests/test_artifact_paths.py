"""The graph files an rknn decoder artifact's own manifest names must lie inside the artifact directory."""

from __future__ import annotations

import json

import pytest

from edgeinfer.contract import registry
from edgeinfer.errors import InputError


def _artifact(tmp_path, decode: str):
    d = tmp_path / "decoder"
    d.mkdir()
    for name in ("seg0.decode.rknn", "seg0.prefill.rknn"):
        (d / name).write_bytes(b"not loaded")
    (tmp_path / "outside.rknn").write_bytes(b"would be loaded")
    (d / "rknn-decoder.json").write_text(json.dumps({
        "format": 1, "kind": "rknn-decoder", "scheme": "fp16", "target": "rk3588", "context": 64, "prefill_chunk": 16,
        "shape": {}, "segments": [{"layers": [0, 4], "decode": decode, "prefill": "seg0.prefill.rknn",
                                   "weight_bytes": 1}]}))
    return d


@pytest.mark.parametrize("decode", ["../outside.rknn", "/etc/hostname", "sub/../../outside.rknn"])
def test_a_segment_graph_outside_the_artifact_is_refused_before_anything_loads(tmp_path, decode):
    d = _artifact(tmp_path, decode)
    with pytest.raises(InputError, match=r"rknn-decoder.json segments\[0\].decode"):
        registry.get_backend("rknn").load_decoder(d, device="simulator", context=64)


def test_segment_names_inside_the_artifact_pass_the_check(tmp_path):
    from edgeinfer_rknn import decoder_export

    d = _artifact(tmp_path, "seg0.decode.rknn")
    assert decoder_export.read_manifest(d)["segments"][0]["decode"] == "seg0.decode.rknn"
