"""llama.cpp maps the GGUF, reads every page of it at load (and, on CPUs with its repacked kernels, copies Q4_0
weights into buffers of its own): the mapped pages are dropped as it loads, not left resident beside the copy
(edgeinfer.contract.pages). Tensors still read from the mapping bring their pages back on use: the decoder
conformance kit (test_conformance.py) checks the tokens of decoders loaded this way against transformers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.testing.llm import model_dir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps: Linux")


def resident(path: Path) -> int:
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and ":" not in head[0]:
            inside = len(head) == 6 and head[5] == str(path.resolve())
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


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
