"""Vision encoders of vision-language decoders: weights from config.json, activations for one image.

Qwen2-VL / Qwen2.5-VL: a ViT over 14×14 patches (Conv3d over 2 frames), the 2×2 patch merger feeds the
LLM one token per merged patch (https://github.com/huggingface/transformers/blob/main/src/transformers/
models/qwen2_vl/modeling_qwen2_vl.py, .../qwen2_5_vl/modeling_qwen2_5_vl.py). Gemma 3: SigLIP at a fixed
896×896 (https://github.com/huggingface/transformers/blob/main/src/transformers/models/siglip/modeling_siglip.py),
pooled to mm_tokens_per_image tokens and projected to the LLM width (modeling_gemma3.py).
"""

from __future__ import annotations

from edgeinfer.errors import InputError, ModelError
from edgeinfer.planning.models.configkeys import first, opt
from edgeinfer.planning.models.spec import ModelSpec

ACT_BYTES = 4  # like the planner: activation rows budgeted in fp32
DEFAULT_IMAGE = (448, 448)


def qwen_vision(vc: dict, llm_hidden: int, v25: bool, where: str) -> dict:
    """Shape facts and parameter count of the Qwen2-VL (``v25=False``) or Qwen2.5-VL vision tower."""
    if not isinstance(vc, dict):
        raise ModelError(f"{where}: config key 'vision_config' must be a JSON object")
    depth = first(vc, ("depth",), where)
    heads = first(vc, ("num_heads",), where)
    p = first(vc, ("patch_size", "spatial_patch_size"), where, default=14)
    m = first(vc, ("spatial_merge_size",), where, default=2)
    tp = first(vc, ("temporal_patch_size",), where, default=2)
    ch = first(vc, ("in_chans", "in_channels"), where, default=3)
    if v25:
        e = first(vc, ("hidden_size",), where)
        mlp = first(vc, ("intermediate_size",), where)
        out = first(vc, ("out_hidden_size",), where, default=llm_hidden)
        norms = 2 * e  # two RMSNorms (weight only)
        ffn = 2 * (e * mlp + mlp) + mlp * e + e  # gate, up, down (SwiGLU, with bias)
        ln_q = e
    else:
        e = first(vc, ("embed_dim",), where)
        mlp = e * first(vc, ("mlp_ratio",), where, default=4)
        out = first(vc, ("hidden_size",), where, default=llm_hidden)
        norms = 4 * e  # two LayerNorms (weight + bias)
        ffn = (e * mlp + mlp) + (mlp * e + e)  # fc1, fc2 (QuickGELU, with bias)
        ln_q = 2 * e
    block = norms + (e * 3 * e + 3 * e) + (e * e + e) + ffn
    wide = e * m * m
    merger = ln_q + (wide * wide + wide) + (wide * out + out)
    params = ch * tp * p * p * e + depth * block + merger  # patch Conv3d has no bias
    return {"kind": "qwen2.5-vl vit" if v25 else "qwen2-vl vit", "depth": depth, "width": e, "mlp": mlp,
            "heads": heads, "patch": p, "merge": m, "temporal_patch": tp, "channels": ch, "out": out,
            "params": params}


def siglip_vision(vc: dict, llm_hidden: int, mm_tokens: int, where: str) -> dict:
    """SigLIP tower of Gemma 3 (fixed image size) + the multimodal projector."""
    if not isinstance(vc, dict):
        raise ModelError(f"{where}: config key 'vision_config' must be a JSON object")
    e = first(vc, ("hidden_size",), where, default=1152)
    mlp = first(vc, ("intermediate_size",), where, default=4304)
    depth = first(vc, ("num_hidden_layers",), where, default=27)
    heads = first(vc, ("num_attention_heads",), where, default=16)
    p = first(vc, ("patch_size",), where, default=14)
    size = first(vc, ("image_size",), where, default=896)
    ch = opt(vc, "num_channels", where) or 3
    n = (size // p) ** 2
    block = 2 * 2 * e + 4 * (e * e + e) + (e * mlp + mlp) + (mlp * e + e)
    params = (ch * p * p * e + e) + n * e + depth * block + 2 * e + (e * llm_hidden + e)
    return {"kind": "siglip", "depth": depth, "width": e, "mlp": mlp, "heads": heads, "patch": p, "merge": 1,
            "temporal_patch": 1, "channels": ch, "out": llm_hidden, "fixed_image": size,
            "mm_tokens": mm_tokens, "params": params}


def image_tokens(v: dict, width: int, height: int) -> tuple[int, int]:
    """(patches the encoder sees, tokens the LLM receives) for one image."""
    if v.get("fixed_image"):
        n = (v["fixed_image"] // v["patch"]) ** 2
        return n, v["mm_tokens"]
    unit = v["patch"] * v["merge"]  # the processor resizes to multiples of patch × merge
    gh = max(1, round(height / unit)) * v["merge"]
    gw = max(1, round(width / unit)) * v["merge"]
    n = gh * gw
    return n, n // (v["merge"] ** 2)


def activation_bytes(v: dict, width: int, height: int) -> int:
    """Largest block's buffers for one image: input rows + max(attention with the score matrix, MLP)
    + the pixel patches + the merged output rows (full attention: the worst layer)."""
    n, out_tokens = image_tokens(v, width, height)
    e = v["width"]
    pixels = n * v["channels"] * v["temporal_patch"] * v["patch"] ** 2 * ACT_BYTES
    rows = n * e * ACT_BYTES
    attn = n * 3 * e * ACT_BYTES + v["heads"] * n * n * ACT_BYTES
    ffn = n * (2 * e + 2 * v["mlp"]) * ACT_BYTES
    return int(pixels + rows + max(attn, ffn) + out_tokens * v["out"] * ACT_BYTES)


def parse_image(text: str) -> tuple[int, int]:
    """``--image WxH`` → (width, height)."""
    parts = str(text).lower().replace("×", "x").split("x")
    try:
        w, h = (int(x) for x in parts)
    except ValueError:
        raise InputError(f"--image must be WIDTHxHEIGHT in pixels, got {text!r}", "for example --image 448x448") \
            from None
    if not (1 <= w <= 16384 and 1 <= h <= 16384):
        raise InputError(f"--image {text} is out of range", "use 1..16384 pixels per side")
    return w, h


def set_image(spec: ModelSpec, width: int, height: int) -> ModelSpec:
    """Budget the vision encoder's activations for one ``width``×``height`` image."""
    if not spec.vision:
        raise InputError(f"--image: {spec.name} has no vision encoder", "drop --image for a text-only model")
    spec.vision_activation_bytes = activation_bytes(spec.vision, width, height)
    n, toks = image_tokens(spec.vision, width, height)
    fixed = spec.vision.get("fixed_image")
    size = f"{fixed}×{fixed} (fixed by the model)" if fixed else f"{width}×{height}"
    spec.vision["image"] = {"width": width, "height": height, "patches": n, "llm_tokens": toks}
    spec.notes = [x for x in spec.notes if not x.startswith("vision encoder:")]
    spec.notes.append(f"vision encoder: activations for one {size} image ({n} patches, {toks} tokens in the "
                      "context; --image WxH to change); its weights are in the total, not in the decode stream")
    return spec
