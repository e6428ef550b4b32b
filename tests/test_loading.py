"""edgeinfer.load: backend choice, conversion of non-native files, and the conversion cache."""

import numpy as np
import pytest

import edgeinfer
from edgeinfer.contract import stamp
from edgeinfer.errors import InputError
from edgeinfer.run import loading
from edgeinfer.testing import models


@pytest.fixture
def mlp(tmp_path):
    return models.mlp(tmp_path, batch=2)


def test_load_onnx_picks_the_reference_backend(mlp):
    with edgeinfer.load(mlp.path) as s:
        assert s.backend_name == "onnxruntime"
        np.testing.assert_allclose(s.run(mlp.feeds)["y"], mlp.reference(mlp.feeds)["y"], rtol=1e-5, atol=1e-6)


def test_conversion_is_cached_by_hash_backend_and_options(mlp, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    be = edgeinfer.backend("onnxruntime")
    first = loading.converted(be, mlp.path, {"scheme": "fp16"})
    mtime = first.stat().st_mtime_ns
    again = loading.converted(be, mlp.path, {"scheme": "fp16"})
    assert again == first and again.stat().st_mtime_ns == mtime  # not converted twice
    assert stamp.read(first)["scheme"] == "fp16"
    other = loading.converted(be, mlp.path, {"scheme": "fp32"})
    assert other != first
    mlp.path.write_bytes(mlp.path.read_bytes())  # rewritten, same content → same key
    assert loading.converted(be, mlp.path, {"scheme": "fp16"}) == first
    (tmp_path / "changed").mkdir()
    changed = models.mlp(tmp_path / "changed", batch=2, seed=1).path  # other weights, same name
    mlp.path.write_bytes(changed.read_bytes())
    new = loading.converted(be, mlp.path, {"scheme": "fp16"})
    assert new != first and first.is_file()  # changed content → a new entry; the old one is kept
    assert stamp.read(new)["source"]["sha256"] != stamp.read(first)["source"]["sha256"]


def test_no_backend_for_unknown_suffix(tmp_path):
    f = tmp_path / "model.weird"
    f.write_bytes(b"x")
    with pytest.raises(InputError, match="no installed backend loads .weird"):
        edgeinfer.load(f)


def test_onnx_given_to_a_backend_with_another_native_format_is_converted_once(mlp, tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "cache"))
    with edgeinfer.load(mlp.path, backend="openvino", device="CPU") as s:
        assert s.backend_name == "openvino"
        np.testing.assert_allclose(s.run(mlp.feeds)["y"], mlp.reference(mlp.feeds)["y"], rtol=1e-4, atol=1e-5)
    irs = list((tmp_path / "cache").rglob("*.xml"))
    assert len(irs) == 1 and stamp.read(irs[0])["scheme"] == edgeinfer.backend("openvino").tensors.default_scheme
    mtime = irs[0].stat().st_mtime_ns
    with edgeinfer.load(mlp.path, backend="openvino", device="CPU"):
        pass
    assert irs[0].stat().st_mtime_ns == mtime  # the cached IR was reused


def _restamp(artifact, toolkit):
    import json

    p = stamp.stamp_path(artifact)
    data = json.loads(p.read_text())
    data["versions"]["toolkit"] = toolkit
    p.write_text(json.dumps(data))


def test_onnxruntime_loads_what_an_older_release_wrote_and_refuses_a_newer_ones(mlp, tmp_path):
    be = edgeinfer.backend("onnxruntime")
    art = be.quantize(mlp.path, "fp32", None, tmp_path / "m.onnx")
    installed = be.versions()["toolkit"]
    _restamp(art, "onnxruntime 1.16.3")
    with be.load(art) as s:
        np.testing.assert_allclose(s.run(mlp.feeds)["y"], mlp.reference(mlp.feeds)["y"], rtol=1e-5, atol=1e-6)
    _restamp(art, "onnxruntime 99.1.0")
    with pytest.raises(InputError) as e:
        be.load(art)
    assert str(e.value) == (f"m.onnx was built with onnxruntime 99.1.0, newer than the installed {installed}; "
                            "upgrade to onnxruntime 99.1.0 or later, or convert the model again here")
