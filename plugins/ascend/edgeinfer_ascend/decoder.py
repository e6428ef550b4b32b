"""The Ascend backend's decoders: step primitives (prefill / decode / reset) over a static KV cache.

Load: a Hugging Face causal LM (or the directory :func:`edgeinfer_ascend.decoder_export.convert_decoder`
wrote) in the scheme's dtype, weight-only INT8 through torchao for ``w8a16``; the KV cache for ``context``
positions × ``slots`` sequences is allocated once (:class:`edgeinfer_ascend.decoder_model.StaticLM`). Prefill pads a
prompt up to the smallest shape bucket that fits (padding is never attended); decode runs every slot at
once, one token each, so there is one decode shape. With ``compile=True`` each bucket and the decode step
are compiled once (``fullgraph=True, dynamic=False``; TorchAir on the NPU, inductor on CPU) and the
compiles are counted. Warm-up at load runs every bucket and the decode step, so the first request pays
for nothing. Device calls (synchronisation, profiler, TorchAir, fused kernels) are in the device module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import OpTime, Progress, StepDecoder, remote_code
from edgeinfer.contract.helpers import check_weight_index
from edgeinfer.errors import InputError, ModelError

from . import decoder_export, decoder_model
from . import device as dev

DEFAULT_BUCKETS = (16, 64, 256, 1024)
# the torch CPU path decodes several times slower than onnxruntime on the same x86 host (docs/serve.md)
CPU_CAVEAT = "ascend: running on CPU through torch (no NPU): for checking, not for speed"
# the activation (and KV-cache) dtype of each scheme; w8a16 keeps activations in the model dtype
SCHEME_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "w8a16": None}


def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def parse_buckets(value: Any, context: int) -> tuple[int, ...]:
    """Prefill buckets that fit the context, smallest first (a bucket of 1 is the decode step's shape)."""
    if value is None:
        value = DEFAULT_BUCKETS
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    try:
        sizes = sorted({int(v) for v in value})
    except (TypeError, ValueError):
        raise InputError(f"prefill_buckets must be positive integers like 16,64,256, got {value!r}") from None
    if any(s < 2 for s in sizes):
        raise InputError(f"prefill buckets must be at least 2 tokens (one token is a decode step), got {value!r}")
    fitting = tuple(s for s in sizes if s <= context)
    return fitting or (context,) if context >= 2 else ()


def chunks(n: int, start: int, context: int, buckets: Sequence[int]) -> Iterator[tuple[int, int, int | None]]:
    """Split ``n`` prompt tokens starting at position ``start`` into (offset, tokens, bucket) steps.

    Each step takes the smallest bucket holding the rest, else the largest bucket, never one that would
    run past the context (padded positions are written to the cache too); None: one token by the decode
    step (the room left is smaller than every bucket)."""
    done = 0
    while done < n:
        room, rest = context - start - done, n - done
        fits = [b for b in buckets if b <= room]
        bucket = next((b for b in fits if b >= rest), fits[-1] if fits else None)
        take = min(rest, bucket) if bucket else 1
        yield done, take, bucket
        done += take


class AscendDecoder(StepDecoder):
    backend_name = "ascend"

    def __init__(self, model_dir: Path, device: str, context: int, slots: int, scheme: str, dtype: str,
                 buckets: tuple[int, ...], compile: bool, compile_mode: str | None, fused: Any, warmup: bool,
                 progress: bool | None, int8: dict[str, Any] | None = None):
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.torch, self.scheme, self.dtype = torch, scheme, dtype
        dev.set_device(device)
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=_torch_dtype(dtype),
                                                     trust_remote_code=remote_code.allowed(model_dir)).eval()
        limit = getattr(model.config, "max_position_embeddings", None)
        if isinstance(limit, int) and context > limit:
            raise InputError(f"context {context} exceeds the model's max_position_embeddings ({limit}); "
                             f"use --ctx {limit}")
        self.int8 = (int8 or decoder_export.int8_recipe()) if scheme == "w8a16" else None
        if self.int8:
            decoder_export.quantize_int8(model, self.int8)
        model = model.to(device)
        self.ops = decoder_model.select_ops(device, fused)
        self.lm = decoder_model.StaticLM(model, context, slots, _torch_dtype(dtype), device, self.ops)
        self.model = model
        self.load_s = time.perf_counter() - t0
        super().__init__(context=context, vocab_size=int(model.config.vocab_size),
                         kv_cache_bytes=self.lm.kv_cache_bytes, slots=slots, device=device)
        self.caveat = CPU_CAVEAT if device == "cpu" else ""
        self.kv_dtype = dtype  # the cache is allocated in the activation dtype (StaticLM)
        self.buckets = buckets
        self.lengths = [0] * slots
        self.compiled = compile
        self.compiles: dict[str, int] = {}  # graph key ("prefill/16", "decode") -> compiler invocations
        self.first_run_s: dict[str, float] = {}  # graph key -> first call at warm-up (the compile included)
        self.step_ms: dict[str, list[float]] = {"prefill": [], "decode": []}  # synchronised step times
        self._current = ""
        self._step = self._compile(compile_mode) if compile else self.lm.step
        self.warmup_s = self._warm_up(progress) if warmup else None

    # --- graphs -------------------------------------------------------------------------------
    def _compile(self, mode: str | None) -> Any:
        torch = self.torch
        from torch._dynamo.backends.registry import lookup_backend

        inner = dev.compile_backend(self.device, None, mode)
        if isinstance(inner, str):
            inner = lookup_backend(inner)

        def counting_backend(gm: Any, example_inputs: Any) -> Any:
            self.compiles[self._current] = self.compiles.get(self._current, 0) + 1
            return inner(gm, example_inputs)

        # compiled graphs are cached per code object (StaticLM.step, shared by every decoder in the process):
        # leave room for each decoder's buckets so none falls back to eager
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, 64)
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 1024)
        return torch.compile(self.lm.step, backend=counting_backend, fullgraph=True, dynamic=False)

    @property
    def graph_keys(self) -> list[str]:
        return [f"prefill/{b}" for b in self.buckets] + ["decode"]

    def _warm_up(self, progress: bool | None) -> float:
        """Run every prefill bucket and the decode step once (compiling them when compiled)."""
        t0 = time.perf_counter()
        what = "compiling and warming up" if self.compiled else "warming up"
        for key in Progress(progress).track(self.graph_keys, f"{what} {len(self.graph_keys)} decoder graphs"):
            t = time.perf_counter()
            if key == "decode":
                self.prefill(0, np.zeros(1, np.int64))
                t = time.perf_counter()
                self.decode([0], np.zeros(1, np.int64))
            else:
                self.prefill(0, np.zeros(int(key.split("/")[1]), np.int64))
            self.first_run_s[key] = time.perf_counter() - t
            self.reset(0)
        self.step_ms = {"prefill": [], "decode": []}
        return time.perf_counter() - t0

    def _run(self, key: str, ids: np.ndarray, pos: np.ndarray, slot_idx: np.ndarray, active: np.ndarray,
             last: np.ndarray) -> np.ndarray:
        torch = self.torch
        d = self.device
        args = [torch.from_numpy(a).to(d) for a in (ids, pos, slot_idx, active, last)]
        self._current = key
        t = time.perf_counter()
        with torch.no_grad():
            out = self._step(*args)
        dev.synchronize(d)  # NPU kernels run asynchronously: time the work, not its launch
        self.step_ms[key.split("/")[0]].append((time.perf_counter() - t) * 1e3)
        return out.cpu().numpy()

    # --- step primitives ----------------------------------------------------------------------
    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise InputError(f"slot {slot} does not exist: this decoder has {self.slots} slot(s)")

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        self._check_slot(slot)
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        start, n = self.lengths[slot], int(ids.shape[0])
        if n == 0:
            raise InputError("prefill needs at least one token")
        if start + n > self.context:
            raise InputError(f"slot {slot}: {start + n} positions exceed the context of {self.context}")
        logits = None
        for offset, take, bucket in chunks(n, start, self.context, self.buckets):
            if bucket is None:
                logits = self._decode_rows({slot: int(ids[offset])})[slot]
                continue
            padded = np.zeros((1, bucket), np.int64)
            padded[0, :take] = ids[offset : offset + take]
            pos = (start + offset + np.arange(bucket, dtype=np.int64))[None]
            logits = self._run(f"prefill/{bucket}", padded, pos, np.array([slot], np.int64), np.ones(1, bool),
                               np.array([take - 1], np.int64))[0]
            self.lengths[slot] = start + offset + take
        return logits

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if len(set(slots)) != len(slots) or len(ids) != len(slots):
            raise InputError("decode takes one token for each of distinct slots")
        rows = {}
        for s, t in zip(slots, ids):
            self._check_slot(s)
            if self.lengths[s] + 1 > self.context:
                raise InputError(f"slot {s}: {self.lengths[s] + 1} positions exceed the context of {self.context}")
            rows[int(s)] = int(t)
        out = self._decode_rows(rows)
        return np.stack([out[s] for s in slots])

    def _decode_rows(self, rows: dict[int, int]) -> dict[int, np.ndarray]:
        """One decode step over every slot (one graph shape); only the slots in ``rows`` advance."""
        ids = np.zeros((self.slots, 1), np.int64)
        active = np.zeros(self.slots, bool)
        for s, t in rows.items():
            ids[s, 0], active[s] = t, True
        # idle slots' rows compute on a valid position and write nothing back
        pos = np.array([[min(n, self.context - 1)] for n in self.lengths], np.int64)
        logits = self._run("decode", ids, pos, np.arange(self.slots, dtype=np.int64), active,
                           np.zeros(self.slots, np.int64))
        for s in rows:
            self.lengths[s] += 1
        return {s: logits[s] for s in rows}

    def reset(self, slot: int) -> None:
        self._check_slot(slot)
        self.lengths[slot] = 0  # stale positions stay in the cache, masked until overwritten

    # --- facts --------------------------------------------------------------------------------
    def op_times(self, phase: str, token_ids: np.ndarray) -> list[OpTime]:
        if phase not in ("prefill", "decode"):
            raise InputError(f"phase must be prefill or decode, got {phase!r}")
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        self.reset(0)
        if phase == "decode":
            self.prefill(0, ids[:-1] if len(ids) > 1 else ids)
            rows = dev.profile_ops(self.device, lambda: self.decode([0], ids[-1:]))
        else:
            rows = dev.profile_ops(self.device, lambda: self.prefill(0, ids))
        self.reset(0)
        kind = "npu" if dev.is_npu(self.device) else self.device.split(":")[0]
        ops = [OpTime(name, name.split("::")[-1], ms, kind) for name, ms, _ in rows if ms > 0]
        return sorted(ops, key=lambda o: o.time_ms, reverse=True)

    def facts(self) -> dict[str, Any]:
        """What was loaded and how: for benchmarks, `edgeinfer generate --json` and bug reports."""
        out: dict[str, Any] = {
            "device": self.device, "scheme": self.scheme, "dtype": self.dtype, "ops": self.ops.name,
            "prefill_buckets": list(self.buckets), "compiled": self.compiled, "compiles": dict(self.compiles),
            "first_run_s": dict(self.first_run_s), "warmup_s": self.warmup_s, "load_s": self.load_s,
            "kv_cache_bytes": self.kv_cache_bytes,
        }
        if self.int8:
            out["quant"] = decoder_export.int8_method(self.int8)
        stats = dev.allocator_stats(self.device)
        if stats:
            out["device_memory"] = stats
        return out

    def release(self) -> None:
        self.lm = None
        self.model = None
        self._step = None
        dev.empty_cache(self.device)


def open_decoder(model: Path, device: str | None, context: int, slots: int, **options: Any) -> AscendDecoder:
    """The backend's ``open_decoder``: validate options, check the scheme, load (the core has checked the
    device's free memory against the plan first: :meth:`AscendBackend.free_memory`)."""
    dev.import_torch()
    model = Path(model)
    manifest = decoder_export.read_manifest(model)
    if manifest is None and not (model.is_dir() and (model / "config.json").is_file()):
        raise ModelError(f"{model} is neither a Hugging Face model directory (config.json) nor an ascend "
                         "decoder artifact; pass the model directory or `edgeinfer deploy` output")
    check_weight_index(model)
    where = dev.pick_device(device)
    built = manifest or {}
    scheme = decoder_export.check_scheme(options.get("scheme") or built.get("scheme") or _default_scheme(where),
                                         where)
    if manifest is not None and scheme != manifest["scheme"]:
        raise InputError(f"{model.name} was converted to {manifest['scheme']}, not {scheme}; convert again or "
                         "drop the scheme option")
    dtype = options.get("dtype") or SCHEME_DTYPE[scheme] or built.get("dtype") or _default_dtype(where)
    if dtype not in ("fp32", "fp16", "bf16"):
        raise InputError(f"dtype must be fp32, fp16 or bf16, got {dtype!r}")
    buckets = parse_buckets(options.get("prefill_buckets", built.get("prefill_buckets")), context)
    if options.get("threads"):
        dev.import_torch().set_num_threads(int(options["threads"]))
    compile_opt = options.get("compile", "auto")
    compiled = dev.is_npu(where) if str(compile_opt).lower() == "auto" else _truthy(compile_opt)
    int8 = built.get("int8", decoder_export.PER_CHANNEL) if manifest is not None else None
    return AscendDecoder(model, where, context, slots, scheme, dtype, buckets, compiled,
                         options.get("compile_mode"), options.get("fused", "auto"),
                         _truthy(options.get("warmup", True)), options.get("progress"), int8)


def _default_scheme(device: str) -> str:
    return "fp16" if dev.is_npu(device) else "fp32"


def _default_dtype(device: str) -> str:
    return "fp16" if dev.is_npu(device) else "fp32"
