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
