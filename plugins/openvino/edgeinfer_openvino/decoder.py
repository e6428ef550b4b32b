"""Decoder models on OpenVINO: GenAI's own loops, or the stateful IR stepped by the core.

* ``loop="native"`` (default): ``openvino_genai.LLMPipeline`` for one sequence (CPU, GPU, and the
  NPU's static pipeline, which always declares one slot), ``openvino_genai.ContinuousBatchingPipeline``
  when ``slots > 1`` (CPU/GPU; paged KV cache sized from context × slots), which also takes requests
  one at a time between its steps (``add_request`` / ``step`` / ``GenerationHandle.cancel``: a
  ``BatchingDecoder``, what ``edgeinfer serve`` drives). Tokens stream through a
  ``StreamerBase``; metrics are GenAI's own ``PerfMetrics``.
* ``loop="steps"``: the same IR through ``ov.Core``, one infer request (its own KV state) per slot,
  so the core runs the loop and sees logits (golden checks, ``record_logits``).

Token ids go in as ``ov.Tensor``, so GenAI's tokenizer is never used for prompts.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import random
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import BatchingDecoder, Decoder, NativeDecoder, NativeStep, StepDecoder, pages
from edgeinfer.contract.packages import import_runtime
from edgeinfer.errors import InputError, ModelError

from . import decoder_config, decoder_export
from .device import fallback_warning, family, select_device

#: KV cache block size of the CPU plugin's paged attention (ContinuousBatchingPipeline); GPU uses 16
BLOCK_SIZE = {"CPU": 32, "GPU": 16}
#: IR schemes whose CPU KV cache is fp16 (the plan's kv_dtype for them). The others keep f32: fp32 is the lossless
#: path, and the CPU plugin's f16 KV cache cost the test model's 4-bit AWQ IR its golden check (logits cosine
#: min 0.9494 < 0.95; 0.9538 with f32), where 8-bit weights lost 0.0001 of it (0.9997 -> 0.9995)
HALF_KV_SCHEMES = ("fp16", "w8a16")
PACK_TOKENS = 16  # a load-time prompt that takes the CPU plugin's multi-row kernels (steps of 7 to 64 tokens)


def model_shape(path: Path) -> dict[str, int]:
    try:
        cfg = json.loads((path / "config.json").read_text())
        heads = cfg["num_attention_heads"]
        return {"layers": cfg["num_hidden_layers"], "kv_heads": cfg.get("num_key_value_heads", heads),
                "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads, "vocab": cfg["vocab_size"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{path / 'config.json'} does not describe a decoder: {e}") from None


def kv_bytes(shape: dict[str, int], positions: int, cfg: decoder_config.DecoderConfig) -> int:
    """K and V of every layer at ``positions``, in ``cfg``'s cache."""
    return shape["layers"] * shape["kv_heads"] * decoder_config.kv_position_bytes(cfg, shape["head_dim"]) * positions


def generation_config(base: Any, options: Any) -> Any:
    """GenAI's GenerationConfig from edgeinfer's GenerationOptions (``base``: the model's defaults)."""
    g = base
    g.max_new_tokens = options.max_new_tokens
    g.repetition_penalty = float(options.repetition_penalty)
    if options.greedy:
        g.do_sample = False
    else:
        g.do_sample = True
        g.temperature = float(options.temperature)
        g.top_p = float(options.top_p)
        if options.top_k:
            g.top_k = int(options.top_k)
        g.rng_seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1, 2**31)
    if options.eos_token_ids is not None:
        g.stop_token_ids = set(options.eos_token_ids)
        if options.eos_token_ids:
            g.eos_token_id = options.eos_token_ids[0]
    g.ignore_eos = bool(options.ignore_eos)
    return g


def _percentiles(values: list[float], *qs: float) -> tuple[float, ...]:
    """numpy's default (linear) percentiles, in plain Python: a request's few hundred values do not
    repay numpy's per-call cost."""
    v = sorted(values)
    out = []
    for q in qs:
        k = (len(v) - 1) * q / 100
        lo = int(k)
        hi = min(lo + 1, len(v) - 1)
        out.append(float(v[lo] + (v[hi] - v[lo]) * (k - lo)))
    return tuple(out)


def perf_metrics(pm: Any) -> dict[str, Any]:
    """GenAI's PerfMetrics in edgeinfer's metric names (GenAI reports ms; raw durations in µs)."""
    ttft = float(pm.get_ttft().mean)
    tpot = float(pm.get_tpot().mean)
    durations = [d / 1e3 for d in pm.raw_metrics.m_durations]
    out: dict[str, Any] = {"ttft_ms": ttft, "tpot_ms": tpot,
                           "decode_tokens_per_s": 1e3 / tpot if tpot > 0 else 0.0,
                           "prefill_tokens_per_s": pm.get_num_input_tokens() / (ttft / 1e3) if ttft > 0 else 0.0,
                           "generated_tokens": int(pm.get_num_generated_tokens())}
    if durations:
        out["tpot_ms_p50"], out["tpot_ms_p99"] = _percentiles(durations, 50, 99)
    return out


def genai() -> Any:
    """openvino_genai, and openvino_tokenizers, which it needs to read the bundle's tokenizer IR: exit 3
    (package_missing) naming the extra that installs them when they are not installed."""
    what, extra = "running an OpenVINO decoder bundle (GenAI's loops)", "edgeinfer-openvino[decoders]"
    og = import_runtime("openvino_genai", extra, what)
    import_runtime("openvino_tokenizers", extra, what)
    return og


@functools.cache
def _streamer_class() -> type:
    og = genai()

    running, stop = og.StreamingStatus.RUNNING, og.StreamingStatus.STOP

    class Streamer(og.StreamerBase):
        def __init__(self, on_token: Callable[[int], bool], seen: list[int]):
            super().__init__()
            self.on_token, self.seen, self.stopped = on_token, seen, False

        def write(self, token: Any) -> Any:
            for t in token if isinstance(token, list) else (token,):
                t = int(t)
                self.seen.append(t)
                if not self.on_token(t):
                    self.stopped = True
            return stop if self.stopped else running

        def end(self) -> None:
            pass

    return Streamer


def _streamer(on_token: Callable[[int], bool], seen: list[int]) -> Any:
    return _streamer_class()(on_token, seen)


class GenAIDecoder(NativeDecoder):
    """GenAI's loops over an exported decoder directory: LLMPipeline for one sequence (the NPU's static
    pipeline whatever ``slots`` asks), the ContinuousBatchingPipeline for ``slots > 1`` (its subclass)."""

    backend_name = "openvino"

    def __init__(self, path: Path, device: str, context: int, slots: int, cfg: decoder_config.DecoderConfig):
        og = genai()
        self._og, self.path, self.cfg = og, path, cfg
        shape = model_shape(path)
        fam = family(device)
        self._pipe = self._cb = None
        self._handles: dict[str, Any] = {}  # running requests of the ContinuousBatchingPipeline
        self._request_ids = itertools.count()
        if fam == "NPU":
            slots = 1  # the NPU's static pipeline decodes one sequence at a time: it declares one slot
        cpu = fam == "CPU"
        # the CPU plugin reads every weight from the mapped IR as it compiles and packs: dropped as it goes; and
        # GenAI gets the IR without the tokenizer IRs it would compile for nothing (token ids in, token ids out)
        with (pages.dropping(path, ".bin") if cpu else contextlib.nullcontext(),
              decoder_export.without_tokenizer_irs(path) if cpu else contextlib.nullcontext(path) as view):
            if slots > 1:
                block = BLOCK_SIZE.get(fam, 32)
                capacity = slots * -(-context // block)  # KV blocks: every slot at the full context
                self.scheduler = og.SchedulerConfig()
                # CPU: no blocks up front. GenAI then allocates the cache as requests need it, 256 positions at a
                # time, keeps it, and stays within `capacity` (every request is held to the context) but for at
                # most one growth step. Given `capacity` blocks up front it hands free blocks out in turn and so
                # touches them all over a run (docs/openvino.md, "KV cache on the CPU").
                self.scheduler.num_kv_blocks = 0 if fam == "CPU" else capacity
                self.scheduler.max_num_seqs = slots
                self.scheduler.max_num_batched_tokens = max(context, 256)
                self.scheduler.dynamic_split_fuse = True
                self.scheduler.enable_prefix_caching = False
                self._cb = og.ContinuousBatchingPipeline(str(view), self.scheduler, device, cfg.properties)
                self._defaults = self._cb.get_config
                kv = kv_bytes(shape, capacity * block, cfg)
            else:
                self._pipe = og.LLMPipeline(str(view), device, **cfg.properties)
                self._defaults = self._pipe.get_generation_config
                kv = kv_bytes(shape, context, cfg)
            super().__init__(context=context, vocab_size=shape["vocab"], kv_cache_bytes=kv, slots=slots,
                             device=device)
            if cpu:
                self._pack_weights()
                pages.collapse_resident()  # the packed weights, read once a token: on 2 MiB pages
        self.execution_devices = _npuw_devices(cfg.properties) if fam == "NPU" else [fam]
        self.kv_dtype = cfg.kv_dtype
        self.threads = cfg.properties.get("INFERENCE_NUM_THREADS")  # asked for; else the CPU plugin's own
        self.fallback = fallback_warning(device, self.execution_devices)
        if self.fallback:
            warnings.warn(self.fallback, decoder_fallback_category(), stacklevel=5)

    def _pack_weights(self) -> None:
        """Two tokens after a prompt of ``PACK_TOKENS``, so that the CPU plugin packs the weights now rather than
        under the first requests (the caller drops the IR's mapped pages meanwhile, :func:`pages.dropping`).
        It packs them once per kind of step, each copy the IR's size: one for steps of 1 to 6 tokens (and of 84 or
        more), another for steps of 7 to 64 (a prompt, or a batch of 7 sequences; an fp16 IR of 366 MiB: 441 MiB
        anonymous after one token, 807 after an 8-token prompt; docs/openvino.md, "Memory on the CPU").
        Packed here, no request re-reads the file (bench/README.md, "OpenVINO's second packed copy")."""
        g = self._defaults()
        g.max_new_tokens = 2
        g.ignore_eos = True
        ids = self._ids([0] * max(1, min(PACK_TOKENS, self.context - 2)))
        if self._pipe is not None:
            self._pipe.generate(ids, g)
        else:
            self._cb.generate([ids], [g])

    def _check(self, prompt_ids: Sequence[int], options: Any) -> Any:
        n = len(prompt_ids)
        if n + options.max_new_tokens > self.context:
            raise InputError(f"prompt ({n}) + max_new_tokens ({options.max_new_tokens}) exceed the context of "
                             f"{self.context}")
        if self.cfg.max_prompt_len is not None and n > self.cfg.max_prompt_len:
            raise InputError(f"prompt of {n} tokens exceeds the NPU pipeline's MAX_PROMPT_LEN "
                             f"({self.cfg.max_prompt_len}) within the context of {self.context}; shorten it or "
                             "load with a larger context / max_prompt_len")
        return generation_config(self._defaults(), options)

    def _ids(self, prompt_ids: Sequence[int]) -> Any:
        import openvino as ov

        return ov.Tensor(np.asarray([list(prompt_ids)], dtype=np.int64))

    def generate_native(self, prompt_ids: Sequence[int], options: Any, on_token: Callable[[int], bool]) -> dict:
        g = self._check(prompt_ids, options)
        seen: list[int] = []
        streamer = _streamer(on_token, seen)
        res = self._pipe.generate(self._ids(prompt_ids), g, streamer)
        tokens = [int(t) for t in res.tokens[0]]
        if not streamer.stopped and tokens[: len(seen)] == seen:
            for t in tokens[len(seen):]:  # what GenAI did not stream (its final EOS)
                if not on_token(t):
                    break
        return perf_metrics(res.perf_metrics)

    def generate_native_batch(self, requests: Sequence[tuple[Sequence[int], Any]],
                              on_token: Callable[[int, int], bool]) -> list[dict[str, Any]]:
        """Generate for all ``requests`` (prompt ids, options), calling ``on_token(i, id)`` per new token of
        request ``i`` (False: stop request ``i`` only); one metrics dict per request. This backend's own API
        (tests, benchmarks): one slot runs one request."""
        if len(requests) > 1:
            raise InputError("this decoder was loaded with slots=1; load it with slots > 1 for many sequences")
        return [self.generate_native(ids, opts, lambda t: on_token(0, t)) for ids, opts in requests]

    def release(self) -> None:
        self._pipe = self._cb = None


class GenAIBatchingDecoder(GenAIDecoder, BatchingDecoder):
    """GenAI's ContinuousBatchingPipeline (``slots > 1``, CPU/GPU): requests join and leave the running batch
    between two pipeline ``step()`` calls, which is how ``edgeinfer serve`` drives it."""

    def generate_native(self, prompt_ids: Sequence[int], options: Any, on_token: Callable[[int], bool]) -> dict:
        return self.generate_native_batch([(prompt_ids, options)], lambda _i, t: on_token(t))[0]

    def generate_native_batch(self, requests: Sequence[tuple[Sequence[int], Any]],
                              on_token: Callable[[int, int], bool]) -> list[dict[str, Any]]:
        """All ``requests`` at once through the ContinuousBatchingPipeline."""
        rids = [f"batch-{next(self._request_ids)}" for _ in requests]
        for rid, (ids, opts) in zip(rids, requests):
            self.add_request(rid, ids, opts)
        handles = [self._handles[rid] for rid in rids]
        index = {rid: i for i, rid in enumerate(rids)}
        live = set(rids)
        while live and self._handles:
            for step in self.step_requests():
                i = index[step.rid]
                for t in step.token_ids:
                    if not on_token(i, t):
                        self._handles.pop(step.rid).stop()  # on_token said stop: nothing more goes to it
                        live.discard(step.rid)
                        break
                if step.finished:
                    live.discard(step.rid)
        return [self._request_metrics(h) for h in handles]

    # --- request by request (edgeinfer serve) -------------------------------------------------------
    def add_request(self, rid: str, prompt_ids: Sequence[int], options: Any) -> None:
        if rid in self._handles:
            raise InputError(f"request {rid!r} is already running")
        g = self._check(prompt_ids, options)
        self._handles[rid] = self._cb.add_request(next(self._request_ids), self._ids(prompt_ids), g)

    def step_requests(self) -> list[NativeStep]:
        if not self._cb.has_non_finished_requests():
            return []
        self._cb.step()
        out = []
        for rid, h in list(self._handles.items()):
            ids = [int(t) for o in h.read().values() for t in o.generated_ids] if h.can_read() else []
            status = str(h.get_status()).split(".")[-1]
            if status == "RUNNING":
                if ids:
                    out.append(NativeStep(rid, ids))
                continue
            del self._handles[rid]
            error = "the pipeline could not schedule this request (IGNORED)" if status == "IGNORED" else None
            out.append(NativeStep(rid, ids, True, error))
        return out

    def cancel_request(self, rid: str) -> None:
        h = self._handles.pop(rid, None)
        if h is not None:
            h.cancel()  # GenAI frees its KV blocks at the next step

    def _request_metrics(self, handle: Any) -> dict[str, Any]:
        try:
            out = perf_metrics(handle.get_perf_metrics())
        except Exception:
            out = {}
        m = self._cb.get_metrics()
        out["kv_cache_usage_max"] = float(m.max_cache_usage)
        return out


def decoder_fallback_category() -> type[Warning]:
    from .session import DeviceFallbackWarning

    return DeviceFallbackWarning


def _npuw_devices(props: dict[str, Any]) -> list[str]:
    """Where the NPU pipeline's work runs: NPUW_DEVICES when set (e.g. the CPU stand-in), else the NPU."""
    listed = str(props.get("NPUW_DEVICES", "NPU"))
    return [d.strip() for d in listed.split(",") if d.strip()] or ["NPU"]


class IRStepDecoder(StepDecoder):
    """The stateful IR stepped by the core: one infer request (one KV state) per slot."""

    backend_name = "openvino"

    def __init__(self, path: Path, device: str, context: int, slots: int, cfg: decoder_config.DecoderConfig):
        import openvino as ov

        shape = model_shape(path)
        core = ov.Core()
        self._compiled = core.compile_model(core.read_model(path / decoder_export.IR), device, cfg.properties)
        self._requests = [self._compiled.create_infer_request() for _ in range(slots)]
        self.lengths = [0] * slots
        super().__init__(context=context, vocab_size=shape["vocab"], slots=slots, device=device,
                         kv_cache_bytes=kv_bytes(shape, context, cfg) * slots)
        self.kv_dtype = cfg.kv_dtype
        self.threads = cfg.properties.get("INFERENCE_NUM_THREADS")  # asked for; else the CPU plugin's own
        try:
            self.execution_devices = [str(d) for d in self._compiled.get_property("EXECUTION_DEVICES")]
        except Exception:
            self.execution_devices = []
        self.fallback = fallback_warning(device, self.execution_devices)
        if self.fallback:
            warnings.warn(self.fallback, decoder_fallback_category(), stacklevel=5)

    def _run(self, slot: int, ids: np.ndarray) -> np.ndarray:
        n, start = int(ids.shape[0]), self.lengths[slot]
        if start + n > self.context:
            raise InputError(f"slot {slot}: {start + n} positions exceed the context of {self.context}")
        feeds = {"input_ids": np.asarray(ids, dtype=np.int64)[None],
                 "attention_mask": np.ones((1, start + n), np.int64),
                 "position_ids": np.arange(start, start + n, dtype=np.int64)[None],
                 "beam_idx": np.zeros(1, np.int32)}
        out = self._requests[slot].infer(feeds)
        self.lengths[slot] = start + n
        return np.asarray(out[0][0, -1], dtype=np.float32)

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        return self._run(slot, token_ids)

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        return np.stack([self._run(s, token_ids[i : i + 1]) for i, s in enumerate(slots)])

    def reset(self, slot: int) -> None:
        self._requests[slot].reset_state()
        self.lengths[slot] = 0

    def release(self) -> None:
        self._requests = []
        self._compiled = None


def default_scheme(fam: str) -> str:
    """The format an HF directory is exported to when none is given: fp16 for the NPU, fp32 elsewhere."""
    return "fp16" if fam == "NPU" else "fp32"


def open_decoder(model: Path, device: str | None, context: int, slots: int, cache_root: Path,
                 options: dict[str, Any]) -> Decoder:
    import openvino as ov

    npu_on_cpu = bool(options.get("npu_on_cpu"))
    available = list(ov.Core().available_devices)
    if npu_on_cpu and "NPU" not in [family(d) for d in available]:
        available.append("NPU")  # the stand-in: the NPU plugin is there, its work goes to the CPU
    built = decoder_export.read_facts(model) if decoder_export.is_ir(model) else {}  # edgeinfer's facts of an IR
    if not device and decoder_export.cpu_build(built):
        device = "CPU"  # where it was built to run, whatever else the machine has
    dev = select_device(device, available)
    fam = family(dev)
    if fam not in ("CPU", "GPU", "NPU"):
        raise InputError(f"decoders run on CPU, GPU or NPU, not {dev!r}")
    options = dict(options)
    if built and str(built.get("target", "cpu")).upper() != fam:
        # the plan's cache (kv_dtype) is the one of the device the IR was built for: an NPU's IR that runs on
        # the CPU here keeps the CPU's default below
        options.pop("kv_dtype", None)
    cfg = decoder_config.parse(options, fam, context)
    if not model.is_dir():
        raise ModelError(f"{model} is not a model directory (a Hugging Face decoder or an OpenVINO decoder export)")
    path = model
    if not decoder_export.is_ir(path):
        path = _exported(model, cfg.scheme or default_scheme(fam), fam, context, cache_root)
        built = decoder_export.read_facts(path)
    if fam == "NPU":
        _check_npu_weights(path, built)
    if fam == "CPU" and not {"kv_precision", "kv_dtype"} & set(options) and built.get("scheme") in HALF_KV_SCHEMES:
        # the KV cache in fp16, as planned (the bundle's kv_dtype) and as llama.cpp keeps it: half of f32's
        # memory; an fp32 IR (or one without edgeinfer's facts) keeps f32, the lossless path
        cfg = decoder_config.parse({**options, "kv_precision": "f16"}, fam, context)
    if cfg.loop == "steps":
        return IRStepDecoder(path, dev, context, slots, cfg)
    batching = slots > 1 and fam != "NPU"  # the NPU's static pipeline decodes one sequence at a time
    return (GenAIBatchingDecoder if batching else GenAIDecoder)(path, dev, context, slots, cfg)


def _check_npu_weights(path: Path, facts: dict[str, Any]) -> None:
    if decoder_export.cpu_build(facts):
        raise InputError(f"{path.name} has INT8 weights in blocks, built for the CPU (target cpu); the NPU takes "
                         "per-channel INT8: load it with device='CPU', or convert it again with target='npu' "
                         "(edgeinfer deploy for an NPU board does)")
    mode = str(facts.get("weight_compression", {}).get("mode", ""))
    if mode.startswith("int4_asym"):
        raise InputError(f"{path.name} has asymmetric INT4 weights; the NPU takes only symmetric INT4: convert "
                         "it again with target='npu' (edgeinfer deploy for an NPU board does)")


def _exported(model: Path, scheme: str, fam: str, context: int, cache_root: Path) -> Path:
    """``model`` converted to ``scheme`` (for ``fam``), once, in the cache."""
    from edgeinfer.contract import cache
    from edgeinfer.contract.stamp import sha256_file

    target = fam.lower()
    entry = cache_root / "openvino-decoders" / cache.key({"source": sha256_file(model), "scheme": scheme,
                                                          "target": target, "versions": decoder_export.versions(),
                                                          "code": cache.code(decoder_export)})
    with cache.locked(entry):  # a concurrent conversion of the same model waits for this one's result
        if cache.reusable(entry, lambda msg: None):
            return entry
        entry.parent.mkdir(parents=True, exist_ok=True)
        work = entry.with_name(entry.name + ".work")
        decoder_export.convert(model, scheme, context, work, None, {"target": target}, cache_root)
        cache.seal_entry(work)
        shutil.rmtree(entry, ignore_errors=True)
        work.rename(entry)
    return entry
