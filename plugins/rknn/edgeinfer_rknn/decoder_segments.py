"""A Hugging Face causal LM as static RKNN-friendly ONNX graphs, one per segment of layers and shape.

The NPU graph of segment ``k`` (layers ``[a, b)``) takes the residual stream ``hidden_a`` [B,T,H],
the rotary tables ``cos``/``sin`` [B,T,D], the additive attention mask ``mask`` [B,T,context+T] and the
past K/V of its layers ``past_k_i``/``past_v_i`` [B,KV,context,D]; it returns ``hidden_b`` (``logits``
[B,1,V] for the last segment, which holds the final norm and the head: of the last row only, since a
step reads one token's logits; the host pads a short prefill chunk at the front so that its last token
is that row) and the new K/V rows ``new_k_i``/``new_v_i`` [B,KV,T,D]. Each of the B rows is its own
sequence (its own position, mask and rotary rows, and past K/V); B is 1 except in the batched decode
graphs (T = 1). The host computes the embedding lookup, the rotary tables and the mask (as float inputs:
gathers, int64 reshapes and boolean ops would fall back to the CPU) and writes the new rows into its
cache. T is 1 (the decode step) or the prefill chunk C.

Layers are written out from the model's own weights (Llama / Qwen2 / Qwen3 / Mistral blocks: RMSNorm,
rotary attention with GQA and optional q/k norms, SwiGLU MLP), so the graph has no cache objects,
no dynamic shapes and only 3-D/4-D tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import remote_code
from edgeinfer.contract.helpers import check_weight_index
from edgeinfer.errors import InputError, ModelError

from .targets import ARCHITECTURES

if TYPE_CHECKING:
    import numpy as np

MASKED = -1.0e4  # additive mask of a position that is not attended (finite: fp16 keeps it, exp() gives 0)


def segment_ranges(layers: int, segments: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges, ``numpy.array_split`` semantics: the first segments take the extra layer."""
    import numpy as np
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= layers:
        raise InputError(f"segments must be an integer from 1 to the model's {layers} layers, got {segments!r}")
    parts = np.array_split(np.arange(layers), segments)
    return [(int(p[0]), int(p[-1]) + 1) for p in parts]


@dataclass(frozen=True)
class Shape:
    """What the graphs and the host buffers need to know about the model."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


def load_hf(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cfg = (model_dir / "config.json")
    if not cfg.is_file():
        raise ModelError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    check_weight_index(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 trust_remote_code=remote_code.allowed(model_dir)).eval()
    arch = model.config.model_type
    if arch not in ARCHITECTURES:
        raise ModelError(f"the rknn decoder export handles {', '.join(ARCHITECTURES)}, not {arch!r}")
    return model


def shape_of(model: Any) -> Shape:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return Shape(int(c.num_hidden_layers), int(c.hidden_size), int(c.num_attention_heads),
                 int(c.num_key_value_heads), int(head_dim), int(c.vocab_size))


def host_tables(model: Any, context: int) -> dict[str, np.ndarray]:
    """The host's part: the embedding table and the rotary cos/sin of positions 0..context-1."""
    import numpy as np
    import torch

    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and context > limit:
        raise InputError(f"context {context} exceeds the model's max_position_embeddings ({limit}); use {limit}")
    emb = model.get_input_embeddings().weight.detach().float().numpy()
    pos = torch.arange(context)[None]
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(1, 1, dtype=torch.float32), pos)
    return {"embed": np.ascontiguousarray(emb), "cos": cos[0].float().numpy(), "sin": sin[0].float().numpy()}


def input_names(first: int, last: int) -> list[str]:
    kv = [f"past_{kind}_{i}" for i in range(first, last) for kind in ("k", "v")]
    return [f"hidden_{first}", "cos", "sin", "mask", *kv]


def output_names(first: int, last: int, final: bool) -> list[str]:
    kv = [f"new_{kind}_{i}" for i in range(first, last) for kind in ("k", "v")]
    return ["logits" if final else f"hidden_{last}", *kv]


def _module(model: Any, first: int, last: int, final: bool, tokens: int, batch: int = 1) -> Any:
    import torch

    shape = shape_of(model)
    eps = float(model.config.rms_norm_eps)
    layers = model.model.layers
    groups = shape.heads // shape.kv_heads
    scale = shape.head_dim ** -0.5

    def rms(x: Any, w: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rotate(x: Any, cos: Any, sin: Any) -> Any:
        half = shape.head_dim // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def heads(x: Any, n: int) -> Any:  # [B,T,n*D] -> [B,n,T,D]
        return x.reshape(batch, tokens, n, shape.head_dim).transpose(1, 2)

    def repeat(x: Any) -> Any:  # GQA: query head h reads kv head h // groups (4-D slices and a concat)
        if groups == 1:
            return x
        return torch.cat([x[:, j:j + 1] for j in range(shape.kv_heads) for _ in range(groups)], dim=1)

    class Segment(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(layers[first:last])  # registered: traced as weights
            self.norm, self.head = (model.model.norm, model.lm_head) if final else (None, None)

        def forward(self, hidden: Any, cos: Any, sin: Any, mask: Any, *past: Any) -> tuple[Any, ...]:
            cos, sin, mask = cos[:, None], sin[:, None], mask[:, None]
            new = []
            for n, layer in enumerate(self.blocks):
                att = layer.self_attn
                x = rms(hidden, layer.input_layernorm.weight)
                q, k, v = heads(att.q_proj(x), shape.heads), heads(att.k_proj(x), shape.kv_heads), \
                    heads(att.v_proj(x), shape.kv_heads)
                if getattr(att, "q_norm", None) is not None:
                    q, k = rms(q, att.q_norm.weight), rms(k, att.k_norm.weight)
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
                new += [k, v]
                keys = repeat(torch.cat([past[2 * n], k], dim=2))
                values = repeat(torch.cat([past[2 * n + 1], v], dim=2))
                scores = torch.matmul(q * scale, keys.transpose(2, 3)) + mask
                o = torch.matmul(torch.softmax(scores, dim=-1), values)
                o = o.transpose(1, 2).reshape(batch, tokens, shape.heads * shape.head_dim)
                hidden = hidden + att.o_proj(o)
                x = rms(hidden, layer.post_attention_layernorm.weight)
                mlp = layer.mlp
                hidden = hidden + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
            if final:
                last = hidden[:, -1:] if tokens > 1 else hidden  # the host left-pads: the last row is the last token
                hidden = self.head(rms(last, self.norm.weight))
            return (hidden, *new)

    return Segment().eval()


def example_inputs(shape: Shape, first: int, last: int, tokens: int, context: int, batch: int = 1
                   ) -> list[np.ndarray]:
    import numpy as np
    kv = np.zeros((batch, shape.kv_heads, context, shape.head_dim), np.float32)
    rows = (batch, tokens)
    return [np.zeros((*rows, shape.hidden), np.float32), np.ones((*rows, shape.head_dim), np.float32),
            np.zeros((*rows, shape.head_dim), np.float32), np.zeros((*rows, context + tokens), np.float32),
            *[kv] * (2 * (last - first))]


def export_segment(model: Any, first: int, last: int, tokens: int, context: int, out: Path, batch: int = 1) -> None:
    """Write the ONNX graph of layers ``[first, last)`` for ``batch`` sequences × ``tokens`` positions per call."""
    import torch

    shape = shape_of(model)
    final = last == shape.layers
    module = _module(model, first, last, final, tokens, batch)
    for p in module.parameters():
        p.requires_grad_(False)
    args = tuple(torch.from_numpy(a) for a in example_inputs(shape, first, last, tokens, context, batch))
    with torch.no_grad():
        torch.onnx.export(module, args, str(out), input_names=input_names(first, last),
                          output_names=output_names(first, last, final), opset_version=17, dynamo=False,
                          do_constant_folding=True)


def weight_bytes(model: Any, first: int, last: int, bytes_per_weight: float) -> int:
    """Bytes of the weights the NPU holds for layers ``[first, last)`` (and the final norm and head
    for the last segment): parameter elements × bytes per element of the scheme. The embedding
    table stays on the host and is not counted."""
    shape = shape_of(model)
    params = [p for i in range(first, last) for p in model.model.layers[i].parameters()]
    if last == shape.layers:
        params += [model.model.norm.weight, model.lm_head.weight]
    return int(sum(p.numel() for p in params) * bytes_per_weight)


def torch_segment(model: Any, first: int, last: int, tokens: int) -> Any:
    """The same graph as a torch module (fp32): the calibration set's source of segment inputs."""
    return _module(model, first, last, last == shape_of(model).layers, tokens)
