"""The shared conformance kit, as far as it applies to a backend that takes torch models.

The kit builds ONNX models; the ascend backend refuses ONNX by design (it runs PyTorch models
through torch_npu), so the cases that need a converted kit model are skipped with that reason.
The cases that do not (discovery, probe, scheme and input errors, corrupt input) run as is.
What the kit would need to cover ascend fully: torch.export (.pt2) variants of its models
(mlp, mlp_dynamic, attention, embedding, two_in_two_out) with the same NumPy references.
"""

from __future__ import annotations

import pytest

from edgeinfer.testing import BackendConformance

ONNX_ONLY = (
    "the conformance kit's models are ONNX, which the ascend backend refuses by design "
    "(it takes HF directories and torch.export .pt2 programs); needs .pt2 variants of the kit models"
)


class TestAscendConformance(BackendConformance):
    backend_name = "ascend"
    load_options = {"warmup": False}

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_run_matches_numpy_reference(self, kit, model):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_dynamic_batch_accepts_other_sizes(self, kit):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_unknown_input_is_named(self, kit):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_missing_input_is_named(self, kit):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_wrong_dtype_says_expected_and_got(self, kit):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_wrong_shape_says_expected_and_got(self, kit):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_profile_fields(self, kit, backend):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_close_and_reuse(self, kit, backend):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_artifact_is_stamped(self, kit, backend):  # type: ignore[override]
        pass

    @pytest.mark.skip(reason=ONNX_ONLY)
    def test_load_refuses_foreign_stamp(self, kit, backend, tmp_path):  # type: ignore[override]
        pass
