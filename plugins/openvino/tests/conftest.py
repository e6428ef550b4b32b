"""Session fixtures of the OpenVINO plugin's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

OV_DECODER_BUNDLE_CTX = 256


@pytest.fixture(scope="session")
def tiny_qwen3_openvino_bundle(tmp_path_factory) -> Path:
    """The committed tiny-qwen3 deployed for ``core-ultra-155h`` (OpenVINO, fp16 for the NPU; it loads on
    the CPU here, the NPU being absent), once per session; the conversion itself comes from the cache
    (edgeinfer.contract.cache), shared with every other deploy of it. Read it, never change it."""
    pytest.importorskip("openvino_genai")
    pytest.importorskip("optimum.intel")
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing.llm import model_dir

    out = tmp_path_factory.mktemp("ov-decoder-bundle") / "tiny-qwen3-ov"
    deploy_decoder(model_dir(), "core-ultra-155h", out, ctx=OV_DECODER_BUNDLE_CTX)
    return out


@pytest.fixture(scope="session")
def tiny_qwen3_openvino_cpu_bundle(tmp_path_factory) -> Path:
    """The committed tiny-qwen3 deployed for ``host --runtime openvino-cpu -q w8a16`` (this plugin's CPU build,
    int8 blocks), once per session. Read it, never change it."""
    pytest.importorskip("openvino_genai")
    pytest.importorskip("optimum.intel")
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing.llm import model_dir

    out = tmp_path_factory.mktemp("ov-cpu-bundle") / "tiny-qwen3-ov-cpu"
    deploy_decoder(model_dir(), "host", out, quant="w8a16", ctx=OV_DECODER_BUNDLE_CTX, runtime="openvino-cpu")
    return out
