"""llama.cpp maps the GGUF, reads every page of it at load (and, on CPUs with its repacked kernels, copies Q4_0
weights into buffers of its own): the mapped pages are dropped as it loads, not left resident beside the copy
(edgeinfer.contract.pages). Tensors still read from the mapping bring their pages back on use: the decoder
conformance kit (test_conformance.py) checks the tokens of decoders loaded this way against transformers."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.mapped import mapped_rss as resident

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps: Linux")


def test_the_mapped_gguf_is_not_left_resident_after_load():
    from edgeinfer_llamacpp.convert import cached_scheme

    import edgeinfer

    gguf = cached_scheme(model_dir(), "gguf:Q4_0")
    d = edgeinfer.backend("llamacpp").load_decoder(gguf, context=128, threads=1)
    try:
        after_load = resident(gguf)
        logits = d.prefill(0, np.arange(5, 21))
    finally:
        d.close()
    assert after_load < gguf.stat().st_size // 4, (after_load, gguf.stat().st_size)
    assert np.isfinite(logits).all() and logits.std() > 0
