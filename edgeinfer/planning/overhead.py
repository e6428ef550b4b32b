"""A runtime's memory overhead in a plan: the fitted entry (a constant, and a share of the weights where that was
fitted: bench/fit_speed.py, or a board's calibration), its vocabulary beyond the one it was measured with, and what
it holds per decoder layer. The planner adds them to the weights, KV cache and activations; fit_speed.py and
``edgeinfer calibrate`` take the per-layer term out of a row before they fit what is left."""

from __future__ import annotations

MIB = 2**20


def runtime_overhead(prof: dict, spec) -> dict:
    """The runtime's overhead entry for ``spec``, its ``decoder`` one for a decoder where it has one (onnxruntime),
    with the runtime's own vocabulary beyond the one it was measured with (``vocab_bytes_per_token``: llama.cpp)."""
    ov = prof.get("overhead_mib") or {"value": 0}
    ov, v = ov["decoder"] if spec.has_kv and "decoder" in ov else ov, prof.get("vocab_bytes_per_token")
    extra = max(0, spec.vocab - v["base_vocab"]) * v["value"] / MIB if v else 0
    return {**ov, "value": ov["value"] + extra, "source": f"{ov.get('source')}; + its vocabulary {extra:.1f} MiB "
            f"({spec.vocab} tokens: runtimes.yaml vocab_bytes_per_token)"} if extra else ov


def runtime_overhead_bytes(ov: dict, weights: float) -> int:
    """A runtime's overhead: ``value`` MiB, plus ``weights_fraction`` of the weights where that was fitted."""
    return int(ov["value"] * MIB + ov.get("weights_fraction", 0.0) * weights)


def layer_overhead_bytes(spec, prof: dict) -> int:
    """What a runtime holds per decoder layer beyond the layer's weights and KV cache (``layer_overhead_mib``:
    OpenVINO's CPU plugin, ~2 MiB of compiled nodes and buffers a layer): a term apart from the fitted overhead,
    which is fitted on what is left after it (bench/fit_speed.py) and so carries no depth of its own."""
    per = (prof.get("layer_overhead_mib") or {}).get("value", 0)
    return int(per * MIB * spec.layers) if spec.has_kv and spec.layers else 0
