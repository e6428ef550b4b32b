"""pytest fixtures shared by the core and plugin test suites (enabled by the root conftest)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from edgeinfer.contract import cache
from edgeinfer.testing import minilm


def _cache_root() -> Path:
    root = os.environ.get("EDGEINFER_TEST_CACHE") or os.path.expanduser("~/.cache/edgeinfer/test-models")
    return Path(root)


def _cached_export(name: str, batch: int | None, seq: int | None) -> Path:
    import torch
    import transformers

    key = f"{name}-torch{torch.__version__}-tf{transformers.__version__}".replace("+", "_")
    out = _cache_root() / key / "model.onnx"
    if not out.exists():
        with cache.locked(out.parent):  # another xdist worker exporting it: wait for its file
            if not out.exists():
                tmp = out.with_name(f".tmp-{os.getpid()}.onnx")
                tmp.parent.mkdir(parents=True, exist_ok=True)
                minilm.export_onnx(tmp, batch=batch, seq=seq)
                os.replace(tmp, out)
    return out


def scorer_dir(kind: str) -> Path:
    """The test ``reranker`` or ``classifier`` directory (edgeinfer.testing.scorers), built once per machine
    (keyed by the installed torch and transformers, read without importing them)."""
    from importlib.metadata import version

    from edgeinfer.testing import scorers

    key = f"{kind}-v{scorers.VERSION}-torch{version('torch')}-tf{version('transformers')}".replace("+", "_")
    out = _cache_root() / key
    if not (out / "config.json").is_file():
        with cache.locked(out):  # another xdist worker building it: wait for its directory
            if not (out / "config.json").is_file():
                tmp = out.with_name(f".tmp-{kind}-{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)
                scorers.build(tmp, kind)
                shutil.rmtree(out, ignore_errors=True)  # not a whole one (no config.json)
                os.replace(tmp, out)
    return out


@pytest.fixture(scope="session")
def reranker_dir() -> Path:
    """A small cross-encoder (BertForSequenceClassification, one label) from MiniLM: edgeinfer.testing.scorers."""
    return scorer_dir("reranker")


@pytest.fixture(scope="session")
def classifier_dir() -> Path:
    """A small text classifier (BertForSequenceClassification, labels scorers.LABELS) from MiniLM."""
    return scorer_dir("classifier")


@pytest.fixture(scope="session")
def minilm_onnx() -> Path:
    """all-MiniLM-L6-v2 as ONNX with dynamic batch and sequence axes."""
    return _cached_export("minilm-dynamic", None, None)


def minilm_static_path() -> Path:
    """all-MiniLM-L6-v2 as ONNX with static shape [1, 128], exported once per machine (the conformance kit's
    real model: it calls this, so a third party's suite needs no fixture plugin)."""
    return _cached_export("minilm-1x128", 1, minilm.SEQ)


@pytest.fixture(scope="session")
def minilm_onnx_static() -> Path:
    """all-MiniLM-L6-v2 as ONNX with static shape [1, 128]."""
    return minilm_static_path()


DECODER_BUNDLE_CTX = 256


@pytest.fixture(scope="session")
def tiny_qwen3_host_bundle(tmp_path_factory) -> Path:
    """The committed tiny-qwen3 deployed for the ``host`` board (onnxruntime fp32, ctx 256), once per
    session; the conversion itself is cached across sessions (edgeinfer.contract.cache). Read it, never
    change it: copy it first to tamper with it."""
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing.llm import model_dir

    out = tmp_path_factory.mktemp("decoder-bundle") / "tiny-qwen3-host"
    deploy_decoder(model_dir(), "host", out, ctx=DECODER_BUNDLE_CTX)
    return out


@pytest.fixture(scope="session")
def tiny_qwen3_host_scheme_bundle(tmp_path_factory):
    """``get(scheme)``: the committed tiny-qwen3 deployed for the ``host`` board in ``scheme`` (fp16, w8a16,
    w8a8, ...; ctx 256) and golden-checked, as the deploy's result (``.bundle``, ``.golden``, ``.manifest``),
    deployed once per session and scheme; the conversion comes from the conversion cache when it holds one
    (the golden check runs every time). Read the bundles, never change them: copy first to tamper."""
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.testing.llm import model_dir

    made = {}

    def get(scheme: str):
        if scheme not in made:
            out = tmp_path_factory.mktemp(f"decoder-bundle-{scheme}") / f"tiny-qwen3-host-{scheme}"
            made[scheme] = deploy_decoder(model_dir(), "host", out, quant=scheme, ctx=DECODER_BUNDLE_CTX)
        return made[scheme]

    return get


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request) -> Path:
    """A directory for one test module's shared fixtures (its bundles, its conversions), removed when the module's
    last test is done: pytest keeps ``mktemp`` directories until the session ends, and a whole run's bundles
    would take more disk than a CI machine may have (``tmp_path`` of a passed test goes at once: pyproject.toml's
    ``tmp_path_retention_policy``)."""
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    shutil.rmtree(path, ignore_errors=True)
