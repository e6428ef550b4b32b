"""Shared, session-scoped MiniLM artifacts (each conversion takes a few seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.testing import minilm

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def ascend():
    return edgeinfer.backend("ascend")


@pytest.fixture(scope="session")
def minilm_artifacts(ascend, tmp_path_factory):
    """scheme -> .ascend artifact of all-MiniLM-L6-v2, converted lazily once per session."""
    root = tmp_path_factory.mktemp("ascend-minilm")
    made: dict[str, Path] = {}

    def get(scheme: str) -> Path:
        if scheme not in made:
            made[scheme] = ascend.quantize(minilm.model_dir() / "model.safetensors", scheme, None,
                                           root / f"minilm-{scheme}.ascend")
        return made[scheme]

    return get


@pytest.fixture(scope="session")
def heldout_feeds():
    return minilm.tokenize(minilm.heldout_sentences(16), seq=64)


# --- decoders (the trained tiny Qwen3 of edgeinfer.testing.llm) ---------------------------------


@pytest.fixture(scope="session")
def llm_dir():
    import torch

    from edgeinfer.testing.llm import model_dir

    torch.set_num_threads(1)  # about 5x faster than 2 threads on the shared CI machine
    return model_dir()


@pytest.fixture(scope="session")
def reference_generator(llm_dir):
    """transformers fp32 eager: the decoders' golden reference."""
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

    d = edgeinfer.backend("transformers").load_decoder(llm_dir, context=128)
    with Generator(d, TextCodec(llm_dir)) as g:
        yield g


@pytest.fixture(scope="session")
def ascend_generator(ascend, llm_dir):
    """scheme -> Generator over an eager ascend decoder (context 128, buckets 16 and 64), loaded once."""
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

    made: dict[str, Generator] = {}

    def get(scheme: str) -> Generator:
        if scheme not in made:
            d = ascend.load_decoder(llm_dir, context=128, scheme=scheme, prefill_buckets=[16, 64])
            made[scheme] = Generator(d, TextCodec(llm_dir))
        return made[scheme]

    yield get
    for g in made.values():
        g.close()
