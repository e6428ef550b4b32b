"""The activation buffers a plan budgets: the largest layer's, with the prompt's attention scores where the runtime
materialises them (docs/planner.md, "Memory model")."""

from __future__ import annotations

from edgeinfer.contract.schemes import Scheme
from edgeinfer.planning import details
from edgeinfer.planning.models.spec import ModelSpec

ACT_BYTES = 4  # activation rows are budgeted in fp32 (llama.cpp/ggml compute buffers are f32)


def fused_attention(prof: dict, scheme: Scheme | None = None, encoder: bool = False) -> bool:
    """Whether the runtime attends without materialising the score matrix: the profile's ``fused_attention``,
    for a decoder of a given ``scheme`` its ``decoder_fused_attention`` where it has one (per scheme name,
    ``default`` for the rest)."""
    per_scheme = None if encoder or scheme is None else prof.get("decoder_fused_attention")
    if per_scheme:
        return bool(per_scheme.get(scheme.name, per_scheme.get("default")))
    return bool(prof.get("fused_attention"))


def spans_batch(prof: dict, encoder: bool) -> bool:
    """Whether one prefill chunk holds the tokens of every sequence of a step: llama.cpp's ``n_ubatch``
    (``chunk_spans_batch``), serve's chunk for a step decoder (``decoder_chunk_spans_batch``)."""
    return bool(prof.get("chunk_spans_batch") or (not encoder and prof.get("decoder_chunk_spans_batch")))


def as_ran(prof: dict, prompt: int | None) -> dict:
    """``prof`` with the prefill chunk a measured row ran: its prompt's tokens where fewer than the runtime's chunk
    (a row's peak holds the prompt it prefilled, not the context its KV cache was allocated for)."""
    if not prompt:
        return prof
    return {**prof, "prefill_chunk": min(int(prompt), int(prof.get("prefill_chunk", 512)))}


def activation_bytes(spec: ModelSpec, ctx: int, batch: int, prof: dict,
                     scheme: Scheme | None = None) -> tuple[int, details.ActivationsDetail]:
    """Largest single layer's buffers + inputs + logits (layers run one after another)."""
    if not spec.layers or not spec.hidden:
        return 0, details.ActivationsDetail("architecture unknown: activations not modelled")
    h, nh = spec.hidden, max(spec.heads, 1)
    hd = spec.head_dim or h // nh
    inter = spec.experts_per_token * spec.moe_intermediate if spec.is_moe else spec.intermediate
    fused = fused_attention(prof, scheme, spec.encoder)
    kv_len = ctx
    # an encoder sees the whole sequence at once
    n = ctx if spec.encoder else min(ctx, int(prof.get("prefill_chunk", 512)))
    tok = max(n, batch) if spans_batch(prof, spec.encoder) else batch * n  # llama.cpp: one n_ubatch for all
    inputs = tok * h * ACT_BYTES
    qkv = tok * (nh + 2 * max(spec.kv_heads,
                              0 if spec.encoder else 1) + (2 * nh if spec.encoder else 0)) * hd * ACT_BYTES
    if fused:
        scores = tok * kv_len * 2  # one f16 tile row per token (flash attention)
    else:
        scores = nh * tok * kv_len * ACT_BYTES * (2 if spec.encoder else 1)  # (+ softmax copy for encoders)
    attn = scores + qkv
    ffn = tok * (2 * h + 2 * inter) * ACT_BYTES
    logits = 0 if spec.encoder else batch * spec.vocab * ACT_BYTES * (prof.get("logits_copies") or {}).get("value", 1)
    out = tok * h * ACT_BYTES if spec.encoder else 0
    total = int(max(inputs + max(attn, ffn) + logits + out, spec.vision_activation_bytes))  # vision runs first
    copies = (prof.get("encoder_activation_copies") or {}).get("value", 1) if spec.encoder else 1
    total = int(total * copies)
    basis = ("whole sequence" if spec.encoder else f"prefill chunk of {n} tokens" + (
        f", {tok} across the batch" if tok != batch * n else "")) + (
        ", fused attention" if fused else ", attention scores materialised") + (
        f", held {copies:g} times by the runtime" if copies != 1 else "")
    return total, details.ActivationsDetail(basis, tokens_per_step=n, inputs=int(inputs), attention=int(attn),
                                            ffn=int(ffn), logits=int(logits + out),
                                            vision_encoder=spec.vision_activation_bytes)
