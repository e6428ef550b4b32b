"""Memory budget and speed estimate: ModelSpec × Board × options -> Plan.

Every formula is written down in docs/planner.md. Nothing heavy is imported here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from edgeinfer.contract.schemes import Scheme, normalize_scheme
from edgeinfer.errors import InputError
from edgeinfer.planning import activation_choice, decoder_segments, details, runtime_choice, serve_memory, speed
from edgeinfer.planning.activations import activation_bytes
from edgeinfer.planning.boards import GIB, Board, get_board, load_boards, safe_loader
from edgeinfer.planning.decision import Decision, decide
from edgeinfer.planning.exportable import refuse_unexportable
from edgeinfer.planning.kv_choice import smaller_kv
from edgeinfer.planning.models import resolve
from edgeinfer.planning.models.spec import ModelSpec
from edgeinfer.planning.overhead import layer_overhead_bytes, runtime_overhead, runtime_overhead_bytes
from edgeinfer.planning.paging import (
    Verdict,
    larger_chunk,
    merge,
    paged_plan,
    paged_runtime,
    paging_need,
    suggest_window,
)
from edgeinfer.planning.prefill import checked as checked_prompt
from edgeinfer.planning.quant import (
    block_of,
    embedding_bits,
    kv_bytes_per_element,
    kv_read_bytes,
    lm_head_bits,
    packed_bits,
    packed_layout,
    planned_kv_dtype,
    row_widths,
)

SCHEMA_VERSION = "1.0"
MIB = 2**20
DATA = Path(__file__).parents[1] / "data"


@lru_cache(maxsize=1)
def runtime_profiles() -> dict:
    import yaml

    return yaml.load((DATA / "runtimes.yaml").read_text(encoding="utf-8"), Loader=safe_loader())  # noqa: S506


@lru_cache(maxsize=1)
def fitted() -> dict:
    p = DATA / "speed_constants.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {"speed": {}, "overhead_mib": {}}


def runtime_profile(name: str) -> dict:
    prof = dict(runtime_profiles().get(name) or {})
    if not prof:
        prof = {"overhead_mib": {"value": 0, "source": "unknown runtime: no overhead budgeted", "uncertain": True}}
    ov = fitted().get("overhead_mib", {}).get(name)
    if ov is not None:
        prof["overhead_mib"] = ov
    return prof


def chunk_for(runtime: str, given: int | None = None) -> int:
    """Prompt tokens one prefill call takes: ``given`` (``plan --prefill-chunk``: ``deploy --option
    prefill_chunk`` where the backend builds the chunk into its graphs, else ``serve --prefill-chunk``),
    else the runtime profile's."""
    return given or int(runtime_profile(runtime).get("prefill_chunk", 512))


def format_key(s: Scheme) -> str:
    """Speed-constant key of a scheme: w8a8, w8a8_g (grouped), w4a16 (any group), fp16, gguf:Q4_0."""
    if s.kind == "int":
        base = s.name.split("_g")[0]
        return base + "_g" if (s.group_size and base == "w8a8") else base
    return s.name


# ----------------------------------------------------------------------------- memory model
def family(scheme: Scheme) -> str:
    """A scheme's name without its group size (``w4a16_g128`` -> ``w4a16``): the key of per-scheme profile rules."""
    return scheme.name.split("_g")[0]


def tied_duplicated(prof: dict, scheme: Scheme, spec: ModelSpec) -> bool:
    """Whether the runtime holds a tied model's table twice (a lookup table beside the LM head): the profile's
    ``tied_duplicated``; for a decoder, its ``decoder_tied_duplicated`` where it has one (per scheme family,
    ``default`` for the rest)."""
    if not spec.tied_embeddings or spec.encoder:
        return False
    per_scheme = prof.get("decoder_tied_duplicated")
    if per_scheme:
        return bool(per_scheme.get(family(scheme), per_scheme.get("default")))
    return bool(prof.get("tied_duplicated"))


def weights_bytes(spec: ModelSpec, scheme: Scheme, prof: dict) -> tuple[int, details.WeightsDetail]:
    """Resident weight bytes and their detail."""
    if prof.get("weights_rule") == "decoder_segments" and not spec.encoder and decoder_segments.pageable(spec):
        return decoder_segments.weights(spec, scheme)
    dup = tied_duplicated(prof, scheme, spec)
    emb_min = prof.get("embed_bits_min", 0) or 0
    if spec.file_weight_bytes is not None and spec.runtime and spec.file_scheme is None:  # a vendor's file
        basis = f"the {spec.file_format} file's size ({scheme.name} assumed: the file does not record it)"
        return spec.file_weight_bytes, details.WeightsDetail(basis, file_bytes=spec.file_weight_bytes)
    if spec.file_weight_bytes is not None and spec.file_scheme == scheme.name:
        emb = sum(b for k, b in spec.tensor_bytes.items()
                  if any(s in k for s in ("embed_tokens", "word_embeddings", "token_embd")))
        extra = emb if dup else 0
        total = spec.file_weight_bytes + extra
        return total, details.WeightsDetail(f"exact per-tensor bytes from the {spec.file_format} file",
                                            file_bytes=spec.file_weight_bytes, embedding_duplicate=extra)
    if not spec.params_total:
        raise InputError(f"model '{spec.name}' has no parameter count", "pass a model file or a config.json")
    bpw = scheme.bpw
    quantized = bpw < 16
    float_held = None if spec.encoder else (prof.get("decoder_float_held") or {}).get(scheme.name)
    held = (prof.get("float_weights_bits_min") or {}).get("value", 0)
    widened = not quantized and not float_held and scheme.kind == "float" and bpw < held  # held wider by the runtime
    bpw = held if widened else bpw
    packed = float_held["bits"] if float_held else packed_bits(scheme, prof)
    bpw = packed if packed is not None else bpw
    emb_bits = max(bpw, emb_min) if quantized else bpw
    head_bits, blocks = lm_head_bits(scheme, prof) or bpw, None
    layout = prof.get(f"int{scheme.weight_bits}_blocks") or {}
    rows = row_widths(spec) if packed is not None and not float_held and layout.get("halve_to") else None
    if rows:  # blocks halved on rows they do not divide: each matrix at its rows' block (quant.block_of)
        blocks = {block_of(scheme, layout, k) for k, _ in rows}  # the first rows are hidden-wide
        bpw = sum(packed_bits(scheme, prof, k) * n for k, n in rows) / sum(n for _, n in rows)
        head_bits = lm_head_bits(scheme, prof) or packed_bits(scheme, prof, spec.hidden)  # hidden-wide rows
        emb_bits = max(head_bits, emb_min)
    if (widened and spec.encoder) or float_held:  # a table that only feeds Gather (any type) is held as stored
        emb_bits = scheme.bpw
    if quantized and not spec.encoder:  # int8 blocks of their own (and a tied head held once, in the same blocks)
        emb_bits = embedding_bits(prof, spec.hidden) or emb_bits
    emb_p = spec.embedding_params
    body_p = spec.params_total - emb_p - (0 if (spec.tied_embeddings or spec.encoder) else spec.lm_head_params)
    body = body_p * bpw / 8
    emb = emb_p * emb_bits / 8
    head = 0.0
    if not spec.encoder:
        if not spec.tied_embeddings:
            head = spec.lm_head_params * head_bits / 8
        elif dup:
            head = emb_p * head_bits / 8
    total = int(math.ceil(body + emb + head))
    basis = f"parameter counts × {bpw:g} bits per weight ({scheme.name}" + (
        f" held as {bpw:g}-bit by the runtime)" if widened else
        f" as the runtime holds it: {float_held['layout'] if float_held else packed_layout(scheme, prof, blocks)})"
        if packed is not None else ")")
    return total, details.WeightsDetail(basis, body=int(body), embedding=int(emb), lm_head=int(head),
                                        embedding_bits=emb_bits)


def kv_bytes(spec: ModelSpec, ctx: int, batch: int, kv_b: float) -> int:
    """kv_elements (2 × kv_heads × head_dim, or MLA's latent) × bytes × batch × Σ_layers(tokens cached)."""
    if not spec.has_kv:
        return 0
    swa = min(spec.sliding_layers, spec.layers) if spec.sliding_window else 0
    tokens = (spec.layers - swa) * ctx + swa * min(ctx, spec.sliding_window or ctx)
    return int(math.ceil(spec.kv_elements * kv_b * batch * tokens))


def decode_stream_bytes(spec: ModelSpec, scheme: Scheme, prof: dict) -> int:
    """Weight bytes read per decode step: non-embedding (active experts) + lm_head."""
    if spec.file_weight_bytes is not None and spec.file_scheme == scheme.name and spec.tensor_bytes:
        tb = spec.tensor_bytes
        emb = sum(b for k, b in tb.items() if any(s in k for s in ("embed_tokens", "word_embeddings", "token_embd")))
        stream = spec.file_weight_bytes - emb + (emb if spec.tied_embeddings else 0)
        if spec.is_moe and spec.experts_per_token:
            exp = sum(b for k, b in tb.items() if "_exps" in k or ".experts." in k)
            stream -= exp - exp * spec.experts_per_token // spec.n_experts
        return int(stream)
    return int(spec.params_active * scheme.bpw / 8 * group_read(scheme, prof))


def group_read(scheme: Scheme, prof: dict) -> float:
    """A block size the runtime's speed rows did not measure (``w4a16_g128`` where the rows hold its blocks of 32)
    reads its packed bits over the measured layout's: the fitted constants count the family's nominal bits."""
    measured = normalize_scheme(scheme.family)
    packed, base = packed_bits(scheme, prof), packed_bits(measured, prof)
    return packed / base * measured.bpw / scheme.bpw if scheme.group_size and packed and base else 1.0


# ----------------------------------------------------------------------------- plan
@dataclass
class Plan:
    model: ModelSpec
    board: Board
    runtime: str
    scheme: Scheme
    ctx: int
    batch: int
    kv_dtype: str
    prefill_chunk: int | None  # asked for; None: the runtime's (``chunk``)
    breakdown: dict[str, int]
    details: details.MemoryDetails
    fits: bool
    reasons: list[str]
    limits: list[dict]
    estimates: details.Estimates
    suggestions: details.Suggestions | None = None  # None: not asked for
    warnings: list[str] = field(default_factory=list)
    decision: Decision | None = None  # how runtime, scheme and context were chosen, and whether they build here

    @property
    def chunk(self) -> int:
        return chunk_for(self.runtime, self.prefill_chunk)

    @property
    def total_bytes(self) -> int:
        return sum(self.breakdown.values())

    @property
    def capacity_bytes(self) -> int:
        return self.board.total_bytes

    @property
    def usable_bytes(self) -> int:
        return self.board.usable_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.total_bytes

    def served(self) -> dict:
        """``memory.served``: this decoder's plan served by ``edgeinfer serve`` (serve_memory.served)."""
        return serve_memory.served(self.breakdown, self.model.vocab, runtime_profile(self.runtime))

    def to_dict(self) -> dict:
        m = self.model
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "edgeinfer.plan",
            "model": {"name": m.name, "source": m.source, "architecture": m.architecture,
                      "params_total": m.params_total, "params_active": m.params_active,
                      "encoder": m.encoder, "layers": m.layers, "hidden": m.hidden, "kv_heads": m.kv_heads,
                      "head_dim": m.head_dim, "file_format": m.file_format},
            "board": {"name": self.board.name, "title": self.board.title, "family": self.board.family,
                      "backend": self.board.backend, "memory_kind": self.board.memory_kind,
                      "origin": self.board.origin},
            "options": {"quant": self.scheme.name, "runtime": self.runtime, "ctx": self.ctx,
                        "batch": self.batch, "kv_dtype": self.kv_dtype,
                        "prefill_chunk": None if m.encoder else self.chunk},  # an encoder sees its whole sequence
            "fits": self.fits,
            "verdict": "fits" if self.fits else "does not fit",
            "reasons": list(self.reasons),
            "memory": {"total_bytes": self.total_bytes, "capacity_bytes": self.capacity_bytes,
                       "usable_bytes": self.usable_bytes, "headroom_bytes": self.headroom_bytes,
                       "breakdown": dict(self.breakdown), "details": self.details.to_dict(), "limits": self.limits,
                       **({"served": self.served()} if m.has_kv and not m.encoder else {})},
            "estimates": self.estimates.to_dict(),
            "suggestions": self.suggestions.to_dict() if self.suggestions else {},
            "warnings": list(self.warnings),
            "build": self.decision.to_dict() if self.decision else None,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def check_int(name: str, v: object) -> int:
    """``--ctx`` / ``--batch`` / ``--prefill-chunk`` as a positive integer in a realistic range, else InputError."""
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            v2 = int(v)
        except (TypeError, ValueError):
            raise InputError(f"--{name} must be a positive integer, got {v!r}") from None
        if v2 != v:
            raise InputError(f"--{name} must be a positive integer, got {v!r}")
        v = v2
    example = {"ctx": 4096, "prefill-chunk": 128, "prompt": 512}.get(name, 1)
    if v <= 0:
        raise InputError(f"--{name} must be a positive integer, got {v}", f"for example --{name} {example}")
    most = 2**24 if name == "ctx" else 65536
    if v > most:
        raise InputError(f"--{name} {v} is out of range: at most {most}", f"for example --{name} {example}")
    return v


def speed_constants(board: Board, runtime: str, scheme: Scheme) -> speed.Found:
    """The board profile's own constants for the format, else the fitted ones (:func:`speed.lookup`)."""
    rt = board.runtimes[runtime]
    fk = format_key(scheme)
    if fk in rt.speed:
        return speed.inline(rt.speed[fk].model_dump(), runtime, fk)
    if not rt.speed_group:
        return speed.Found(None, f"no speed constants for runtime {runtime} on {board.name}")
    return speed.lookup(fitted().get("speed", {}), rt.speed_group, runtime, fk)


def estimate_speed(spec: ModelSpec, board: Board, runtime: str, scheme: Scheme, ctx: int, batch: int,
                   kv_b: float, prompt: int | None = None) -> details.Estimates:
    """Decode at ``ctx``; prefill and the TTFT of a ``prompt`` (None: of prefill.PROMPTS and of ``ctx``)."""
    prof = runtime_profile(runtime)
    stream = decode_stream_bytes(spec, scheme, prof)
    kv_read = kv_bytes(spec, ctx, batch, kv_b)  # kv_b: quant.kv_read_bytes, the bytes a value reads at its pace
    per_step = stream + kv_read
    out = {"runtime": runtime, "decode_tokens_per_s": None, "prefill_tokens_per_s": None,
           "bytes_per_token": per_step, "weight_bytes_per_token": stream, "kv_bytes_per_token_at_ctx": kv_read,
           "bandwidth_gbps": board.bandwidth_gbps.value if board.bandwidth_gbps else None,
           "roofline_tokens_per_s": None, "roofline_fraction": None, "t0_ms": None, "bw_eff_gbps": None,
           "prefill_fraction_of_peak": None, "basis": None,
           "assumes": "decode at the full context (KV read of ctx tokens each step), batch sequences per step"}
    found = speed_constants(board, runtime, scheme)
    consts = found.consts
    out["basis"] = found.basis if not spec.encoder else "encoder: no token-by-token decode; " + found.basis
    if consts is None or board.bandwidth_gbps is None:
        if board.bandwidth_gbps is None:
            out["basis"] = f"{board.name} claims no memory bandwidth: no speed estimate"
        return details.Estimates(**out)
    bw = board.bandwidth_gbps.value * 1e9
    bw_eff = speed.effective_bandwidth(consts, bw)
    if not spec.encoder:
        step = speed.step_seconds(consts, bw, per_step)
        out["decode_error_pct"], out["error_basis"] = found.error_pct, found.error_basis
        out["decode_tokens_per_s"] = round(batch / step, 3)
        out["roofline_tokens_per_s"] = round(batch * bw / per_step, 3)
        out["roofline_fraction"] = round((per_step / bw) / step, 3)
    out["t0_ms"] = consts["t0_ms"]
    out["bw_eff_gbps"], out["bw_fraction"] = round(bw_eff / 1e9, 2), bw_eff / bw
    out.update(found.prefill(board, spec.params_active, None if spec.encoder else ctx, prompt))
    return details.Estimates(**out)


def _memory(spec, board, runtime, scheme, ctx, batch, kv_b, chunk=None):
    prof = {**runtime_profile(runtime), "prefill_chunk": chunk_for(runtime, chunk)}
    w, wd = weights_bytes(spec, scheme, prof)
    kv = kv_bytes(spec, ctx, batch, kv_b)
    act, ad = activation_bytes(spec, ctx, batch, prof, scheme)
    ov = board.runtimes[runtime].overhead() or runtime_overhead(prof, spec)
    per_layer = layer_overhead_bytes(spec, prof)
    rt = runtime_overhead_bytes(ov, w) + per_layer
    frac = prof.get("memory_fraction")
    if frac:
        rt += int((1 - frac["value"]) * board.usable_bytes)
    bd = {"weights": int(w), "kv_cache": int(kv), "activations": int(act), "runtime": rt,
          "reserved": board.reserve_bytes}
    det = details.MemoryDetails(wd, ad, details.KvCacheDetail(kv_b, ctx, batch, spec.kv_bytes_per_token(kv_b)),
                                details.RuntimeDetail(ov["value"], ov.get("source"), frac["value"] if frac else None,
                                                      ov.get("weights_fraction"),
                                                      round(per_layer / MIB, 1) if per_layer else None),
                                details.ReservedDetail(board.os_reserve_gib.value, board.os_reserve_gib.source))
    return bd, det


def _fits(spec, board, runtime, scheme, ctx, batch, kv_b, chunk=None) -> bool:
    bd, _ = _memory(spec, board, runtime, scheme, ctx, batch, kv_b, chunk)
    rt = board.runtimes[runtime]
    if rt.max_context and ctx > rt.max_context:
        return False
    return sum(bd.values()) <= board.total_bytes


def plan(model, board, quant: str | None = None, ctx: int | None = None, batch: int = 1, kv_dtype: str | None = None,
         paging: int | None = None, runtime: str | None = None, suggest: bool = True,
         extra_boards=(), segments: int | None = None, storage: str | None = None,
         prefill_chunk: int | None = None, prompt: int | None = None) -> Plan:
    """Plan ``model`` (reference or ModelSpec) on ``board`` (name, path or Board).

    Runtime, scheme and context are :func:`edgeinfer.planning.decision.decide`'s (what ``deploy`` builds;
    ``ctx`` None: the model's limit, capped). ``paging=W`` plans layer-paged execution (edgeinfer.run.paged,
    docs/paging.md): W of ``segments`` (default: one per layer) resident, the rest streamed from ``storage``
    once per token. ``prefill_chunk``: prompt tokens per prefill call (None: the runtime's default); ``prompt``:
    the prompt whose time to the first token the estimates give (None: 128 tokens and the context's)."""
    ctx = None if ctx is None else check_int("ctx", ctx)
    chunk = None if prefill_chunk is None else check_int("prefill-chunk", prefill_chunk)
    batch = check_int("batch", batch)
    if paging is None and (segments is not None or storage is not None):
        raise InputError("--segments and --storage go with --paging W (segments resident at once)")
    spec = model if isinstance(model, ModelSpec) else resolve(model)
    b = get_board(board, extra=extra_boards)
    decision = decide(spec, b, runtime=runtime or paged_runtime(b, spec, paging), quant=quant, ctx=ctx,
                      paging=paging, segments=segments)
    rt_name, scheme, ctx = decision.runtime, decision.scheme, decision.ctx
    refuse_unexportable(spec, b, rt_name)
    prof = runtime_profile(rt_name)
    kvd = planned_kv_dtype(prof, rt_name, scheme, kv_dtype)
    kv_b = kv_bytes_per_element(kvd, spec.head_dim)
    bd, det = _memory(spec, b, rt_name, scheme, ctx, batch, kv_b, chunk)
    total = sum(bd.values())
    # (what, text): paging replaces the "memory" reason and answers the "weights_window" warning
    reasons: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = [("model", n) for n in spec.notes]
    if decision.note:
        warnings.append(("scheme", decision.note))
    limits: list[dict] = []
    if total > b.total_bytes:
        reasons.append(("memory", memory_reason(total, b)))
    rt = b.runtimes[rt_name]
    if rt.max_context and ctx > rt.max_context:
        reasons.append(("context", f"context {ctx} exceeds {rt_name}'s maximum {rt.max_context}"))
    if b.npu_window_gib:
        win = int(b.npu_window_gib.value * GIB)
        largest = max(spec.tensor_bytes.values()) if spec.tensor_bytes else int(
            max(spec.embedding_params * max(scheme.bpw, prof.get("embed_bits_min", 0) or 0),
                spec.lm_head_params * scheme.bpw) / 8)
        kv_one = bd["kv_cache"]
        limits.append({"name": "npu_window", "limit_bytes": win, "largest_tensor_bytes": largest,
                       "kv_cache_bytes": kv_one, "ok": largest <= win,
                       "source": b.npu_window_gib.source})
        if largest > win:
            reasons.append(("npu_window", f"largest tensor ({largest / GIB:.2f} GiB) exceeds the "
                                          f"{b.npu_window_gib.value:g} GiB NPU IOMMU window"))
        if kv_one > win:
            warnings.append(("kv_window", f"KV cache ({kv_one / GIB:.2f} GiB) is larger than one "
                                          f"{b.npu_window_gib.value:g} GiB NPU window: needs RKNPU driver >= 0.9.8 "
                                          "(rknn-llm #232)"))
        if bd["weights"] > win:
            warnings.append(("weights_window", f"weights exceed one {b.npu_window_gib.value:g} GiB NPU window: "
                                               "needs RKNPU driver >= 0.9.8 with base_domain_id "
                                               "(rknn-llm #232, #335)"))
    for k, f in (("memory_total_gib", b.memory_total_gib), ("os_reserve_gib", b.os_reserve_gib)):
        if f.uncertain:
            warnings.append(("board", f"{b.name}: {k} is uncertain ({f.source})"))
    fits = not reasons
    unpaged = Verdict([t for k, t in reasons if k != "memory"], [t for k, t in warnings if k != "weights_window"])
    prompt = checked_prompt(None if prompt is None else check_int("prompt", prompt), ctx, spec.encoder)
    est = estimate_speed(spec, b, rt_name, scheme, ctx, batch, kv_read_bytes(prof, kvd, spec.head_dim), prompt)
    p = Plan(model=spec, board=b, runtime=rt_name, scheme=scheme, ctx=ctx, batch=batch, kv_dtype=kvd,
             prefill_chunk=chunk, breakdown=bd, details=det, fits=fits, reasons=[t for _, t in reasons],
             limits=limits, estimates=est, warnings=[t for _, t in warnings], decision=decision)
    if suggest:
        p.suggestions = suggestions(p, extra_boards)
    if paging is not None:
        merge(p, paged_plan(p, paging, segments, storage, p.chunk), unpaged)
        if p.suggestions is not None:
            p.suggestions.prefill_chunk = larger_chunk(p, plan)
    return p


def memory_reason(total: int, b: Board) -> str:
    """The reason a plan of ``total`` bytes does not fit ``b`` (a chain replaces it with its own sum)."""
    return (f"needs {total / GIB:.2f} GiB, the board has {b.total_bytes / GIB:.2f} GiB "
            f"({b.usable_bytes / GIB:.2f} GiB usable after the OS/driver reserve)")


def suggestions(p: Plan, extra_boards=()) -> details.Suggestions:
    spec, b, kv_b = p.model, p.board, p.details.kv_cache.bytes_per_element
    need = paging_need(p)
    out = details.Suggestions(paging=suggest_window(p, p.chunk) if need else None)
    if out.paging:
        out.paging["why"] = need
    # largest context that fits (memory grows with ctx: binary search)
    rt = b.runtimes[p.runtime]
    hi = rt.max_context or 2**20
    if spec.max_position:
        hi = min(hi, max(spec.max_position, 1))
    if not spec.has_kv and not spec.layers:
        hi = min(hi, p.ctx)
    lo = 0
    if _fits(spec, b, p.runtime, p.scheme, 1, p.batch, kv_b, p.prefill_chunk):
        lo, top = 1, hi
        while lo < top:
            mid = (lo + top + 1) // 2
            if _fits(spec, b, p.runtime, p.scheme, mid, p.batch, kv_b, p.prefill_chunk):
                lo = mid
            else:
                top = mid - 1
        out.max_ctx = lo
    # schemes that fit at the requested context, best quality first
    kind = "encoder" if spec.encoder else "decoder"
    seen = {}
    for rname, r in b.runtimes.items():
        if kind not in r.kinds:
            continue
        for s in r.schemes:
            sc = normalize_scheme(s)
            if sc.name not in seen and _fits(spec, b, rname, sc, p.ctx, p.batch, kv_b, p.prefill_chunk):
                seen[sc.name] = (sc.bpw, rname)
    ranked = sorted(seen.items(), key=lambda kv: -kv[1][0])
    out.quants_that_fit = [{"quant": n, "runtime": r, "bits_per_weight": bpw} for n, (bpw, r) in ranked]
    out.quant = ranked[0][0] if ranked else None
    out.runtime = runtime_choice.faster_runtime(p, plan)
    out.activations = activation_choice.int8_activations(p, plan)
    out.kv_cache = smaller_kv(p, plan, runtime_profile(p.runtime))
    # smallest board of the same family that fits with the same options (only needed when it does not fit:
    # loading every profile costs tens of milliseconds on the fast path)
    if b.family != "host" and not p.fits:
        fam = list(load_boards(extra_boards, family=b.family).values())
        for x in sorted(fam, key=lambda x: (x.total_bytes, x.name)):
            if p.runtime in x.runtimes and p.scheme.name in x.runtimes[p.runtime].schemes \
                    and _fits(spec, x, p.runtime, p.scheme, p.ctx, p.batch, kv_b, p.prefill_chunk):
                out.board = x.name
                break
    return out
