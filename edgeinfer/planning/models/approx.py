"""An unsupported architecture planned from the tensor shapes of its safetensors files, labelled
"approximate": layers from the tensor names, the KV cache from the K and V projections of layer 0,
every parameter from the shapes (exact), the decode stream = all parameters but the embedding lookup
(MoE experts are not told apart: an upper bound)."""

from __future__ import annotations

import re

from edgeinfer.errors import ModelError
from edgeinfer.planning.models.configkeys import opt
from edgeinfer.planning.models.spec import ModelSpec

_LAYER = re.compile(r"(?:layers?|blk|h|block)\.(\d+)\.")
_EMBED = ("embed_tokens", "word_embeddings", "wte.", "tok_embeddings")
_K = re.compile(r"(?:k_proj|key|wk)\.weight$")
_V = re.compile(r"(?:v_proj|value|wv)\.weight$")
_UP = re.compile(r"(?:up_proj|fc1|w1|gate_proj|dense_h_to_4h)\.weight$")


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _layer0(shapes: dict[str, list[int]], pattern: re.Pattern) -> list[int] | None:
    for k, s in shapes.items():
        m = _LAYER.search(k)
        if m and int(m.group(1)) == 0 and pattern.search(k) and len(s) == 2:
            return s
    return None


def spec_from_shapes(cfg: dict, shapes: dict[str, list[int]], name: str, source: str) -> ModelSpec:
    mt = str(cfg.get("model_type"))
    idx = {int(m.group(1)) for k in shapes if (m := _LAYER.search(k))}
    emb = next((s for k, s in shapes.items() if any(e in k for e in _EMBED) and len(s) == 2), None)
    if not idx or emb is None:
        raise ModelError(f"unsupported model_type '{mt}' in {source}, and its safetensors tensors name no "
                         "numbered layers and no token embedding to plan from",
                         "plan a supported architecture (edgeinfer plan lists them on this error)")
    V, h = emb
    spec = ModelSpec(name=name, source=source, architecture=f"{mt} (approximate)", layers=max(idx) + 1, hidden=h,
                     vocab=V, max_position=opt(cfg, "max_position_embeddings", source))
    heads = opt(cfg, "num_attention_heads", source)
    k, v = _layer0(shapes, _K), _layer0(shapes, _V)
    up = _layer0(shapes, _UP)
    spec.intermediate = up[0] if up else 4 * h
    note = f"approximate: model_type '{mt}' is not supported; planned from the safetensors tensor shapes"
    if k and v:
        spec.head_dim = opt(cfg, "head_dim", source) or (h // heads if heads else k[0])
        spec.heads = heads or max(1, h // spec.head_dim)
        spec.kv_heads = max(1, k[0] // spec.head_dim)
        spec.kv_row = k[0] + v[0]  # K and V rows of layer 0, every layer assumed alike
        note += f" (KV cache: {spec.kv_row} elements per token per layer from layer 0's K/V projections)"
    else:
        spec.heads = heads or 1
        note += " (no K/V projections found: KV cache and attention not modelled)"
    total = sum(_count(s) for s in shapes.values())
    emb_n = V * h
    has_head = any(k.startswith("lm_head") for k in shapes)
    spec.tied_embeddings = not has_head
    spec.embedding_params = spec.lm_head_params = emb_n
    spec.params_total = total
    spec.params_active = total - emb_n + (0 if has_head else emb_n)
    spec.notes.append(note + "; sliding windows, MoE routing and vision parts are not told apart")
    return spec
