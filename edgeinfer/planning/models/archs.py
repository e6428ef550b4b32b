"""Config readers for decoder architectures whose parameter or KV layout is not the plain llama one.

Each reader turns a Hugging Face config.json into a ModelSpec with the parameter counts of the
architecture's modeling file (cited per function) and, where the cache differs from
2 × kv_heads × head_dim per layer, ``kv_row`` or the sliding-window layer count (docs/planner.md#architectures).
"""

from __future__ import annotations

from collections.abc import Callable

from edgeinfer.errors import ModelError
from edgeinfer.planning.models import vision
from edgeinfer.planning.models.configkeys import first, layers, need, opt
from edgeinfer.planning.models.spec import ModelSpec

_TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _dtype(cfg: dict) -> str | None:
    return _TORCH_DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or ""), None)


def _dense(spec: ModelSpec, attn: int, mlp: int, norms: int, tied: bool) -> ModelSpec:
    """Fill the counts of a decoder whose layers are all alike: attention + MLP + per-layer norms."""
    h, V = spec.hidden, spec.vocab
    body = spec.layers * (attn + mlp + norms) + h  # + final norm
    spec.tied_embeddings = tied
    spec.embedding_params = spec.lm_head_params = V * h
    spec.params_total = body + V * h * (1 if tied else 2)
    spec.params_active = body + V * h  # lm_head read every token
    return spec


def _gqa(h: int, nh: int, kv: int, hd: int) -> int:
    return h * nh * hd + 2 * h * kv * hd + nh * hd * h


def _base(cfg: dict, mt: str, name: str, source: str, *, L: int, h: int, nh: int, kv: int, hd: int,
          inter: int, V: int, max_pos: int | None) -> ModelSpec:
    if kv > nh or nh % kv:
        raise ModelError(f"{source}: {kv} key/value heads must divide {nh} attention heads",
                         "fix config.json or download it again")
    return ModelSpec(name=name, source=source, architecture=mt, layers=L, hidden=h, heads=nh, kv_heads=kv,
                     head_dim=hd, intermediate=inter, vocab=V, native_dtype=_dtype(cfg), max_position=max_pos)


def _head_dim(cfg: dict, h: int, nh: int, source: str, key: str = "head_dim") -> int:
    hd = opt(cfg, key, source)
    if hd is None:
        if h % nh:
            raise ModelError(f"{source}: hidden_size {h} is not a multiple of {nh} heads and config.json gives "
                             f"no {key}", "fix config.json or download it again")
        hd = h // nh
    return hd


def _text_spec(tc: dict, cfg: dict, mt: str, name: str, source: str) -> ModelSpec:
    """The spec from the standard Hugging Face text keys of ``tc`` (``text_config``, or the config itself);
    the weights' dtype from the outer ``cfg``."""
    h = need(tc, "hidden_size", source)
    nh = need(tc, "num_attention_heads", source)
    spec = _base(tc, mt, name, source, L=layers(tc, "num_hidden_layers", source), h=h, nh=nh,
                 kv=opt(tc, "num_key_value_heads", source) or nh, hd=_head_dim(tc, h, nh, source),
                 inter=need(tc, "intermediate_size", source), V=need(tc, "vocab_size", source),
                 max_pos=opt(tc, "max_position_embeddings", source))
    spec.native_dtype = _dtype(cfg) or spec.native_dtype
    return spec


def chatglm(cfg: dict, mt: str, name: str, source: str) -> ModelSpec:
    """ChatGLM2/3, GLM-4 (THUDM modeling_chatglm.py, e.g. https://huggingface.co/THUDM/chatglm3-6b/blob/main/
    modeling_chatglm.py): fused query_key_value with multi-query groups, SwiGLU dense_h_to_4h of 2 × ffn."""
    L = layers(cfg, "num_layers", source)
    h = need(cfg, "hidden_size", source)
    nh = need(cfg, "num_attention_heads", source)
    hd = _head_dim(cfg, h, nh, source, "kv_channels")
    kv = (need(cfg, "multi_query_group_num", source) if cfg.get("multi_query_attention", True) else nh)
    inter = need(cfg, "ffn_hidden_size", source)
    V = first(cfg, ("padded_vocab_size", "vocab_size"), source)
    spec = _base(cfg, mt, name, source, L=L, h=h, nh=nh, kv=kv, hd=hd, inter=inter, V=V,
                 max_pos=opt(cfg, "seq_length", source))
    attn = _gqa(h, nh, kv, hd) + ((nh + 2 * kv) * hd if cfg.get("add_qkv_bias") else 0)
    lin_bias = (h + 2 * inter + h) if cfg.get("add_bias_linear") else 0
    return _dense(spec, attn + lin_bias, 3 * h * inter, 2 * h, bool(cfg.get("tie_word_embeddings", False)))


def llama_like(cfg: dict, mt: str, name: str, source: str) -> ModelSpec:
    """InternLM2 (fused wqkv, https://huggingface.co/internlm/internlm2-chat-7b/blob/main/modeling_internlm2.py),
    Baichuan2 (W_pack, multi-head; 13B uses ALiBi, which adds no parameter and no cache,
    https://huggingface.co/baichuan-inc/Baichuan2-13B-Chat/blob/main/modeling_baichuan.py), MiniCPM (llama
    layers with scaled residuals, https://huggingface.co/openbmb/MiniCPM-2B-sft-bf16/blob/main/modeling_minicpm.py)."""
    spec = _text_spec(cfg, cfg, mt, name, source)
    spec.max_position = spec.max_position or opt(cfg, "model_max_length", source)
    h, nh, kv, hd, inter = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate
    attn = _gqa(h, nh, kv, hd)
    if cfg.get("bias") or cfg.get("attention_bias"):
        attn += (nh + 2 * kv) * hd + h
    tied = bool(cfg.get("tie_word_embeddings", mt == "minicpm"))
    return _dense(spec, attn, 3 * h * inter, 2 * h, tied)


# Gemma3TextConfig defaults: the multimodal configs leave these keys out of text_config
# (https://github.com/huggingface/transformers/blob/main/src/transformers/models/gemma3/configuration_gemma3.py)
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                        "head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 4096,
                        "sliding_window_pattern": 6}


def gemma3(cfg: dict, mt: str, name: str, source: str) -> ModelSpec:
    """Gemma 3 (modeling_gemma3.py): q/k norms, four norms per layer, tied embeddings; layers alternate
    five sliding-window to one global (sliding_window_pattern 6, or the explicit layer_types list)."""
    tc = cfg
    if mt == "gemma3":
        tc = cfg.get("text_config") or {}
        if not isinstance(tc, dict):
            raise ModelError(f"{source}: config key 'text_config' must be a JSON object")
        tc = {**GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in tc.items() if v is not None}}
    spec = _text_spec(tc, cfg, mt, name, source)
    L, h, nh, kv, hd = spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    _dense(spec, _gqa(h, nh, kv, hd) + 2 * hd, 3 * h * spec.intermediate, 4 * h, True)
    sw = opt(tc, "sliding_window", source)
    if sw:
        spec.sliding_window, spec.sliding_layers = sw, _gemma3_sliding(tc, L, source)
    if mt == "gemma3":
        mm = opt(cfg, "mm_tokens_per_image", source) or 256
        _add_vision(spec, vision.siglip_vision(cfg.get("vision_config") or {}, h, mm, source))
    return spec


def _gemma3_sliding(tc: dict, L: int, source: str) -> int:
    lt = tc.get("layer_types")
    if lt is not None:
        if not isinstance(lt, list) or len(lt) != L:
            raise ModelError(f"{source}: config key 'layer_types' must list one type per layer ({L})")
        return sum(1 for t in lt if t == "sliding_attention")
    pattern = opt(tc, "sliding_window_pattern", source) or 6
    return sum(1 for i in range(L) if (i + 1) % pattern)  # every pattern-th layer is global


def deepseek_v2(cfg: dict, mt: str, name: str, source: str) -> ModelSpec:
    """DeepSeek-V2 / V2-Lite (https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/modeling_deepseek.py):
    multi-head latent attention (the cache holds the kv_lora_rank latent + the shared rope key per token and
    layer, arXiv:2405.04434 §2.1.3), dense MLP in the first first_k_dense_replace layers, then routed + shared
    experts."""
    L = layers(cfg, "num_hidden_layers", source)
    h = need(cfg, "hidden_size", source)
    nh = need(cfg, "num_attention_heads", source)
    nope, rope = need(cfg, "qk_nope_head_dim", source), need(cfg, "qk_rope_head_dim", source)
    vd, r_kv = need(cfg, "v_head_dim", source), need(cfg, "kv_lora_rank", source)
    r_q = opt(cfg, "q_lora_rank", source)
    V = need(cfg, "vocab_size", source)
    spec = _base(cfg, mt, name, source, L=L, h=h, nh=nh, kv=nh, hd=nope + rope,
                 inter=need(cfg, "intermediate_size", source), V=V,
                 max_pos=opt(cfg, "max_position_embeddings", source))
    spec.kv_row = r_kv + rope
    q = h * nh * (nope + rope) if r_q is None else h * r_q + r_q + r_q * nh * (nope + rope)
    attn = q + h * (r_kv + rope) + r_kv + r_kv * nh * (nope + vd) + nh * vd * h
    E = opt(cfg, "n_routed_experts", source) or 0
    dense_mlp = 3 * h * spec.intermediate
    total = active = L * (attn + 2 * h)
    if E:
        k = need(cfg, "num_experts_per_tok", source)
        mi = need(cfg, "moe_intermediate_size", source)
        shared = opt(cfg, "n_shared_experts", source, minimum=0) or 0
        first_dense = opt(cfg, "first_k_dense_replace", source, minimum=0) or 0
        freq = opt(cfg, "moe_layer_freq", source) or 1
        if k > E:
            raise ModelError(f"{source}: num_experts_per_tok {k} is larger than n_routed_experts {E}",
                             "fix config.json or download it again")
        spec.n_experts, spec.experts_per_token, spec.moe_intermediate = E, k, mi
        n_moe = sum(1 for i in range(L) if i >= first_dense and i % freq == 0)
        total += n_moe * ((E + shared) * 3 * h * mi + E * h) + (L - n_moe) * dense_mlp
        active += n_moe * ((k + shared) * 3 * h * mi + E * h) + (L - n_moe) * dense_mlp
    else:
        total += L * dense_mlp
        active += L * dense_mlp
    tied = bool(cfg.get("tie_word_embeddings", False))
    spec.tied_embeddings = tied
    spec.embedding_params = spec.lm_head_params = V * h
    spec.params_total = total + h + V * h * (1 if tied else 2)
    spec.params_active = active + h + V * h
    return spec


def qwen_vl(cfg: dict, mt: str, name: str, source: str) -> ModelSpec:
    """Qwen2-VL / Qwen2.5-VL: a Qwen2 language model (q/k/v biases) + the vision tower (planning/models/vision.py).
    Newer exports nest the language keys in text_config."""
    tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    spec = _text_spec(tc, cfg, mt, name, source)
    h, nh, kv, hd = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    tied = bool(cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings", False)))
    _dense(spec, _gqa(h, nh, kv, hd) + (nh + 2 * kv) * hd, 3 * h * spec.intermediate, 2 * h, tied)
    _add_vision(spec, vision.qwen_vision(cfg.get("vision_config"), h, mt == "qwen2_5_vl", source))
    return spec


def _add_vision(spec: ModelSpec, v: dict) -> None:
    spec.vision = v
    spec.vision_params = v["params"]
    spec.params_total += v["params"]
    vision.set_image(spec, *vision.DEFAULT_IMAGE)


READERS: dict[str, Callable[[dict, str, str, str], ModelSpec]] = {
    "chatglm": chatglm, "internlm2": llama_like, "baichuan": llama_like, "minicpm": llama_like,
    "gemma3": gemma3, "gemma3_text": gemma3, "deepseek_v2": deepseek_v2,
    "qwen2_vl": qwen_vl, "qwen2_5_vl": qwen_vl,
}
EXTRA_DECODERS = tuple(READERS)


def spec_from_extra(cfg: dict, mt: str, name: str, source: str) -> ModelSpec:
    return READERS[mt](cfg, mt, name, source)
