"""deploy's warning before a conversion that may not fit this machine's memory (runtimes.yaml ``conversion_peak``:
rknn-toolkit2's, measured on tiny-qwen3 and SmolLM2-135M)."""

from __future__ import annotations

from pathlib import Path

from edgeinfer.deploy import conversion_memory, decoder
from edgeinfer.planning.planner import plan
from edgeinfer.progress import Progress
from edgeinfer.testing import llm

GIB = 2**30


def _available(monkeypatch, gib: float) -> None:
    monkeypatch.setattr(conversion_memory, "meminfo", lambda: (64 * GIB, int(gib * GIB)))


def test_an_rknn_conversion_is_estimated_at_what_it_took_here(monkeypatch):
    """tiny-qwen3 for rk3588-8g peaked at 0.88 GiB here (/usr/bin/time -v edgeinfer deploy): with 0.5 GiB
    available the warning says about 0.9 GiB; with 2 GiB, nothing. Qwen3-0.6B (~0.6 B parameters, 2.4 GB of fp32
    weights) would take tens of GiB in one segment, less a segment when built in four."""
    p = plan(str(llm.model_dir()), "rk3588-8g", ctx=256)
    _available(monkeypatch, 0.5)
    warning = conversion_memory.shortfall(p)
    assert warning.startswith("converting for rknn may take about 0.9 GiB at its peak (estimated from the "
                              "conversions measured in runtimes.yaml conversion_peak)")
    assert warning.endswith("this machine has 0.5 GiB available, so the conversion may be killed for lack of "
                            "memory: close other programs, or deploy on a machine with more memory")
    _available(monkeypatch, 2)
    assert conversion_memory.shortfall(p) is None
    big = plan("qwen3-0.6b", "rk3588-8g", ctx=256)
    _available(monkeypatch, 1)
    one, four = (float(conversion_memory.shortfall(big, n).split("about ")[1].split(" GiB")[0]) for n in (1, 4))
    assert 20 < one < 40 and one / 5 < four < one / 3


def test_a_runtime_without_a_measured_converter_gets_no_warning(monkeypatch):
    _available(monkeypatch, 0.01)
    assert conversion_memory.shortfall(plan(str(llm.model_dir()), "host", ctx=256)) is None


def test_the_warning_is_said_before_converting_and_not_when_the_cache_has_the_conversion(monkeypatch, tmp_path,
                                                                                         capsys):
    said: list[str] = []
    monkeypatch.setattr(decoder, "_convert", lambda *a: said.append("converted"))

    class Backend:
        name = "stand-in"

    cached = decoder.converted(Backend(), Path("m"), "fp16", 64, None, {}, {}, tmp_path, Progress(enabled=False),
                               False, "converting for rknn may take about 9.0 GiB")
    assert not cached and said == ["converted"]
    assert capsys.readouterr().err == "warning: converting for rknn may take about 9.0 GiB\n"
    decoder.converted(Backend(), Path("m"), "fp16", 64, None, {}, {}, tmp_path, Progress(enabled=False), False)
    assert capsys.readouterr().err == ""  # no warning, no line
    # the conversion in the cache: reused, nothing converted, no warning
    monkeypatch.setattr(decoder.cache, "area", lambda name: tmp_path / "area")
    monkeypatch.setattr(decoder.cache, "reusable", lambda entry, note: True)
    entry = tmp_path / "area" / "stand-in" / f"decoder-{decoder.cache.key({})}"
    entry.mkdir(parents=True)
    assert decoder.converted(Backend(), Path("m"), "fp16", 64, None, {}, {}, tmp_path / "work",
                             Progress(enabled=False), True, "converting for rknn may take about 9.0 GiB")
    assert said == ["converted", "converted"] and "warning: " not in capsys.readouterr().err
