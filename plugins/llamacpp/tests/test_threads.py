"""Threads a llama.cpp decoder runs with: llama.cpp's 4 at most, one CPU left free, at least one; ``threads``
wins. What the context really runs with is read back from llama.cpp (``llama_n_threads``)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("cpus", "threads"), [(1, 1), (2, 1), (3, 2), (5, 4), (64, 4)])
def test_default_threads_leave_a_cpu_free(cpus, threads):
    from edgeinfer_llamacpp.decoder import default_threads

    assert default_threads(cpus) == threads


def test_a_decoder_runs_with_the_default_or_the_asked_threads(monkeypatch):
    import os

    from edgeinfer_llamacpp.convert import cached_scheme

    import edgeinfer
    from edgeinfer.testing.llm import model_dir

    gguf = cached_scheme(model_dir(), "gguf:Q8_0")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    for asked, runs in [(None, 2), (3, 3)]:
        d = edgeinfer.backend("llamacpp").load_decoder(gguf, context=256, slots=1,
                                                       **({"threads": asked} if asked else {}))
        try:
            assert d._ll.llama_n_threads(d._ctx) == runs and d._ll.llama_n_threads_batch(d._ctx) == runs
            assert d.threads == runs  # what bench reports
        finally:
            d.close()


def test_bench_reports_the_threads_the_decoder_ran_with(capfd):
    import json

    from edgeinfer_llamacpp.convert import cached_scheme
    from edgeinfer_llamacpp.decoder import default_threads

    from edgeinfer.testing.cli import run_cli
    from edgeinfer.testing.llm import model_dir

    gguf = cached_scheme(model_dir(), "gguf:Q8_0")
    for asked, runs in [([], default_threads()), (["--threads", "2"], 2)]:
        r = run_cli(capfd, "bench", str(gguf), "--prompt-lengths", "8", "--new-tokens", "2", "--repeat", "1",
                    "--json", *asked)
        assert r.returncode == 0 and json.loads(r.stdout)["threads"] == runs, r.stderr[-800:]
