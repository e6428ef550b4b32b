"""The decoder's forward pass over a fixed-size KV cache: one step function for prefill buckets and decode.

The Hugging Face model supplies the weights (its ``nn.Linear`` / norm modules, so torchao weight-only INT8
applies as on the encoder path); this module runs the Llama-family math itself so that every shape is
static: the cache holds ``slots × context`` positions per layer, attention always spans the whole context
with a mask, and a step writes its keys / values at explicit positions. One graph per input shape, so
``torch.compile(dynamic=False)`` compiles once per prefill bucket and once for decode.

Layouts follow the fused Ascend operators: queries and the cache are BSND (batch, sequence, heads, head
dim), the rotary tables BS1D. The three operators that have fused NPU kernels — RMSNorm, rotary embedding
and attention — go through an *ops* object; :func:`select_ops` is the one place that picks the fused NPU
kernels (:func:`edgeinfer_ascend.device.npu_fused_ops`) or the reference math below (SDPA on CPU).
"""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import ModelError

# Llama-family architectures whose HF modules this forward reproduces (q/k/v/o projections, optional
# per-head q/k RMSNorm (Qwen3), SiLU-gated MLP, RMSNorm, rotary position embedding, no sliding window)
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


class ReferenceOps:
    """The fused operators' math in plain torch, matching transformers' modules; SDPA for attention."""

    name = "reference (torch: SDPA attention, RMSNorm and rotary in plain ops)"
    fused = False

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        import torch

        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(dtype)

    def rotary(self, x: Any, cos: Any, sin: Any) -> Any:
        """``x`` BSND, ``cos`` / ``sin`` BS1D: x·cos + rotate_half(x)·sin."""
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def attention(self, q: Any, k: Any, v: Any, mask: Any, scale: float) -> Any:
        """``q`` [B, T, H, D], ``k`` / ``v`` [B, S, KVH, D] (BSND), ``mask`` [B, 1, T, S] bool (True: attend)."""
        import torch

        groups = q.shape[2] // k.shape[2]
        qh = q.transpose(1, 2)
        kh = k.transpose(1, 2).repeat_interleave(groups, dim=1)
        vh = v.transpose(1, 2).repeat_interleave(groups, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        return out.transpose(1, 2)  # back to BSND


def select_ops(device: str, fused: Any = "auto") -> Any:
    """The capability switch: fused NPU operators where the device has them (or a given ops object), else
    the reference math. ``fused``: "auto", True (require them), False, or an ops object (tests' stand-in)."""
    from . import device as dev

    if isinstance(fused, str):
        words = {"auto": "auto", "true": True, "on": True, "1": True, "false": False, "off": False, "0": False}
        if fused.strip().lower() not in words:
            from edgeinfer.errors import InputError

            raise InputError(f"fused must be auto, true or false, got {fused!r}")
        fused = words[fused.strip().lower()]
    if fused not in ("auto", True, False, None):
        return fused
    if fused is False or fused is None:
        return ReferenceOps()
    ops = dev.npu_fused_ops(device)
    if ops is None:
        if fused is True:
            from edgeinfer.errors import BackendUnavailableError

            raise BackendUnavailableError(
                f"fused Ascend operators asked for but {device} has none (they need torch_npu on an NPU); "
                "omit fused=true to use the reference operators"
            )
        return ReferenceOps()
    return ops


def check_architecture(config: Any) -> None:
    if config.model_type not in SUPPORTED:
        raise ModelError(
            f"the ascend decoder runs {', '.join(SUPPORTED)} models, not {config.model_type!r}; "
            "use --backend transformers or onnxruntime for this one"
        )
    sliding = getattr(config, "use_sliding_window", False) or "sliding_attention" in (
        getattr(config, "layer_types", None) or ())
    if sliding:
        raise ModelError(f"{config.model_type} with sliding-window attention is not supported by the ascend "
                         "decoder's static cache; use --backend transformers")


def check_context(config: Any, context: int) -> None:
    """Mistral-style configs carry a window; it changes nothing while the context fits inside it."""
    window = getattr(config, "sliding_window", None)
    if config.model_type == "mistral" and window and context > window:
        raise ModelError(f"context {context} exceeds the model's attention window ({window}); use --ctx {window}")


def kv_shape(config: Any, slots: int, context: int) -> tuple[int, int, int, int]:
    """One layer's K (or V) cache: [slots, context, kv_heads, head_dim] (BSND)."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (slots, context, kv_heads, head_dim)


class StaticLM:
    """A causal LM's step over a static KV cache. Build once; call :meth:`step` (eager or compiled)."""

    def __init__(self, model: Any, context: int, slots: int, dtype: Any, device: str, ops: Any):
        import torch

        cfg = model.config
        check_architecture(cfg)
        check_context(cfg, context)
        self.config, self.ops, self.context, self.slots = cfg, ops, context, slots
        inner = model.model
        self.embed, self.layers, self.norm, self.lm_head = inner.embed_tokens, inner.layers, inner.norm, model.lm_head
        self.eps = float(cfg.rms_norm_eps)
        shape = kv_shape(cfg, slots, context)
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, shape[2], shape[3]
        self.scale = self.head_dim ** -0.5
        # allocated once, here; steps write into them in place and nothing ever reallocates them
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers]
        self.cos, self.sin = _rotary_tables(inner.rotary_emb, context, dtype, device)
        self.positions = torch.arange(context, device=device)

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.nbytes for t in self.k_cache + self.v_cache)

    def step(self, ids: Any, pos: Any, slot_idx: Any, active: Any, last: Any) -> Any:
        """``ids`` / ``pos`` [B, T] int64, ``slot_idx`` / ``last`` [B] int64, ``active`` [B] bool.

        Writes row b's keys / values at positions ``pos[b]`` of slot ``slot_idx[b]`` (rows that are not
        active leave the cache as it was) and returns the logits at ``last[b]`` as float32 [B, vocab]."""
        import torch

        b, t = ids.shape
        h = self.embed(ids)
        cos, sin = self.cos[pos].unsqueeze(2), self.sin[pos].unsqueeze(2)  # BS1D
        # row b at position p sees cache positions 0..p of its slot
        mask = (self.positions[None, None, :] <= pos[:, :, None]).unsqueeze(1)  # [B, 1, T, S]
        keep = active[:, None, None, None]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = self.ops.rms_norm(h, layer.input_layernorm.weight, self.eps)
            q = attn.q_proj(x).view(b, t, self.heads, self.head_dim)
            k = attn.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
            v = attn.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm per head before the rotary embedding
                q = self.ops.rms_norm(q, attn.q_norm.weight, attn.q_norm.variance_epsilon)
                k = self.ops.rms_norm(k, attn.k_norm.weight, attn.k_norm.variance_epsilon)
            q, k = self.ops.rotary(q, cos, sin), self.ops.rotary(k, cos, sin)
            kc, vc = self.k_cache[i], self.v_cache[i]
            where = (slot_idx[:, None], pos)
            kc.index_put_(where, torch.where(keep, k, kc[where]))
            vc.index_put_(where, torch.where(keep, v, vc[where]))
            o = self.ops.attention(q, kc[slot_idx], vc[slot_idx], mask, self.scale)
            h = h + attn.o_proj(o.reshape(b, t, self.heads * self.head_dim))
            x = self.ops.rms_norm(h, layer.post_attention_layernorm.weight, self.eps)
            mlp = layer.mlp
            h = h + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        h = h[torch.arange(b, device=h.device), last]
        h = self.ops.rms_norm(h, self.norm.weight, self.eps)
        return self.lm_head(h).float()


def _rotary_tables(rotary_emb: Any, context: int, dtype: Any, device: str) -> tuple[Any, Any]:
    """cos / sin for positions 0..context-1 as transformers computes them (float32, then the model dtype):
    the model's own inverse frequencies and attention scaling, so rope-scaled configs come out right."""
    import torch

    inv_freq = rotary_emb.inv_freq.to(device=device, dtype=torch.float32)
    scaling = float(getattr(rotary_emb, "attention_scaling", 1.0))
    freqs = torch.arange(context, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)
