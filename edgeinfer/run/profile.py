"""``edgeinfer profile``: latency and the slowest operators of a model, from its backend's own profiler.

Encoders (a model file or bundle): :meth:`Session.profile` on the bundle's golden input, or on a
synthetic one built from the model's input specs. Decoders (a Hugging Face causal-LM directory or
a decoder bundle): per phase — prefill of a prompt of exact length, then single decode steps —
the wall time of the step primitives and :meth:`Decoder.op_times` of one call.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract.backend import OpTime, Session, TensorSpec, latency_stats
from edgeinfer.contract.boundary import plugin_call
from edgeinfer.contract.decoder import Decoder, NativeDecoder
from edgeinfer.errors import InputError
from edgeinfer.run.generation.generator import Generator

PHASES = ("prefill", "decode")
DEFAULT_TOP, DEFAULT_REPEAT, DEFAULT_PROMPT = 10, 10, 128
ALL_OPS = 1 << 30
SYNTHETIC_SEQ = 128  # symbolic sequence axes of a model file without golden inputs


def check_counts(top: int, repeat: int) -> None:
    if top < 1:
        raise InputError(f"--top must be at least 1, got {top}")
    if repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {repeat}")


def profile(loaded: Session | Generator, model: Path, top: int = DEFAULT_TOP, repeat: int = DEFAULT_REPEAT,
            prompt_length: int | None = None) -> dict[str, Any]:
    """Profile what :func:`edgeinfer.load` returned for ``model`` (a Session or a Generator)."""
    check_counts(top, repeat)
    if isinstance(loaded, Generator):
        return profile_decoder(loaded, model, top, repeat, prompt_length)
    if prompt_length is not None:
        raise InputError("--prompt-length applies to decoder models")
    return profile_encoder(loaded, model, top, repeat)


# --- encoders -----------------------------------------------------------------------------------


def profile_encoder(session: Session, model: Path, top: int, repeat: int) -> dict[str, Any]:
    feeds, source = encoder_feeds(session, model)
    prof = session.profile(feeds, repeat=repeat, warmup=1, top=ALL_OPS)  # cut to top below, after the count
    return {
        "kind": "encoder",
        "model": str(model),
        "backend": session.backend_name,
        "device": session.device,
        "input": {"source": source, "shapes": {k: list(v.shape) for k, v in feeds.items()}},
        "runs": prof.runs,
        "latency_ms": prof.latency_ms,
        "peak_memory_bytes": prof.peak_memory_bytes,
        **_ops_json(prof.ops, top, _no_ops_reason(session.backend_name, type(session).op_times
                                                  is Session.op_times)),
        "notes": prof.notes,
    }


def encoder_feeds(session: Session, model: Path) -> tuple[dict[str, np.ndarray], str]:
    """The bundle's first golden input, or a synthetic one from the input specs."""
    from edgeinfer.model.kind import Kind, find
    from edgeinfer.model.samples import load_saved_samples

    golden = model / "golden" / "inputs.npz"
    if find(model) is Kind.ENCODER_BUNDLE and golden.is_file():
        return load_saved_samples(golden)[0], "golden input of the bundle"
    return synthetic_feeds(session.inputs), (f"synthetic: batch 1, symbolic axes {SYNTHETIC_SEQ}, token ids 1, "
                                             "floats from a seeded normal")


def synthetic_feeds(specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for spec in specs:
        shape = tuple(d if isinstance(d, int) and d > 0 else (1 if i == 0 else SYNTHETIC_SEQ)
                      for i, d in enumerate(spec.shape))
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            out[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:  # token ids, masks, positions: 1 is valid for all of them
            out[spec.name] = np.ones(shape, dtype=dtype)
    return out


# --- decoders -----------------------------------------------------------------------------------


def profile_decoder(gen: Generator, model: Path, top: int, repeat: int, prompt_length: int | None) -> dict[str, Any]:
    from edgeinfer.run.generation.bench import prompt_of_length

    d = gen.decoder
    n = _prompt_length(d, repeat, prompt_length)
    ids = np.asarray(prompt_of_length(gen.codec, n), dtype=np.int64)
    native = isinstance(d, NativeDecoder)
    if native:
        phases = _native_latencies(gen, ids, repeat)
    else:
        phases = {"prefill": _prefill_latency(d, ids, repeat), "decode": _decode_latency(d, ids, repeat)}
    no_ops = _no_ops_reason(d.backend_name, type(d).op_times is Decoder.op_times)
    for phase in PHASES:
        phases[phase].update(_ops_json(_call(d, "op_times", phase, ids), top, no_ops))
    if not native:
        _call(d, "reset", 0)
    return {
        "kind": "decoder",
        "model": str(model),
        "backend": d.backend_name,
        "device": d.device,
        "context": d.context,
        "prompt_tokens": n,
        "runs": repeat,
        "phases": phases,
    }


def _prompt_length(d: Decoder, repeat: int, asked: int | None) -> int:
    room = d.context - repeat - 1  # the decode phase takes repeat + 1 steps after the prompt
    if asked is not None:
        if asked < 1:
            raise InputError(f"--prompt-length must be at least 1, got {asked}")
        if asked > room:
            raise InputError(f"--prompt-length {asked} + {repeat + 1} decode steps exceed the context of "
                             f"{d.context}; use --prompt-length up to {max(room, 0)} or a larger --ctx")
        return asked
    if room < 1:
        raise InputError(f"the context of {d.context} leaves no room for a prompt before {repeat + 1} decode steps; "
                         "lower --repeat or use a larger --ctx")
    return min(DEFAULT_PROMPT, room)


def _prefill(d: Decoder, ids: np.ndarray) -> np.ndarray:
    _call(d, "reset", 0)
    chunk = d.prefill_chunk or len(ids)
    logits = None
    for i in range(0, len(ids), chunk):
        logits = _call(d, "prefill", 0, ids[i : i + chunk])
    return logits


def _prefill_latency(d: Decoder, ids: np.ndarray, repeat: int) -> dict[str, Any]:
    _prefill(d, ids)  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        _prefill(d, ids)
        times.append((time.perf_counter() - t) * 1e3)
    return {"tokens": len(ids), "latency_ms": latency_stats(times),
            "what": f"reset + prefill of {len(ids)} tokens"}


def _decode_latency(d: Decoder, ids: np.ndarray, repeat: int) -> dict[str, Any]:
    logits = _prefill(d, ids)
    times = []
    for step in range(repeat + 1):  # step 0 is the warm-up
        tok = np.asarray([int(np.argmax(logits))], dtype=np.int64)
        t = time.perf_counter()
        logits = _call(d, "decode", [0], tok)[0]
        if step:
            times.append((time.perf_counter() - t) * 1e3)
    return {"tokens": 1, "latency_ms": latency_stats(times),
            "what": f"one greedy decode step at positions {len(ids) + 1}..{len(ids) + repeat}"}


def _native_latencies(gen: Generator, ids: np.ndarray, repeat: int) -> dict[str, Any]:
    """A backend that runs its own loop: prefill = TTFT, decode = each run's median time per token."""
    from edgeinfer.contract.generation import GenerationOptions

    opts = GenerationOptions(max_new_tokens=min(8, gen.context - len(ids)), ignore_eos=True)
    gen.generate_ids(ids.tolist(), opts)
    runs = [gen.generate_ids(ids.tolist(), opts).metrics for _ in range(repeat)]
    tpot = [m.tpot_ms_p50 for m in runs if m.tpot_ms_p50 is not None]
    return {"prefill": {"tokens": len(ids), "latency_ms": latency_stats([m.ttft_ms for m in runs]),
                        "what": "time to first token of the backend's own loop"},
            "decode": {"tokens": 1, "latency_ms": latency_stats(tpot) if tpot else None,
                       "what": "median time per output token of each run of the backend's own loop"}}


# --- shared -------------------------------------------------------------------------------------


def _ops_json(ops: list[OpTime], top: int, no_ops: str) -> dict[str, Any]:
    ranked = sorted(ops, key=lambda o: o.time_ms, reverse=True)
    total = sum(o.time_ms for o in ranked)
    rows = [{"name": o.name, "op_type": o.op_type, "time_ms": o.time_ms, "exec_type": o.exec_type,
             "share": (o.time_ms / total) if total > 0 else None} for o in ranked[:top]]
    return {"ops": rows, "ops_profiled": len(ranked), "ops_total_ms": total,
            "ops_note": None if ranked else no_ops}


def _no_ops_reason(backend: str, not_implemented: bool) -> str:
    if not_implemented:
        return f"backend {backend!r} gives no per-operator times (its SDK has no profiler edgeinfer reads)"
    return f"backend {backend!r} returned no per-operator times for this model"


def _call(d: Decoder, method: str, *args: Any) -> Any:
    return plugin_call(d.backend_name, f"decoder {method}", getattr(d, method), *args)
