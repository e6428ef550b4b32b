"""Hugging Face config.json and safetensors-header reader (no tensor is loaded)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from edgeinfer.errors import ModelError
from edgeinfer.planning.models.approx import spec_from_shapes
from edgeinfer.planning.models.archs import EXTRA_DECODERS, spec_from_extra
from edgeinfer.planning.models.configkeys import layers
from edgeinfer.planning.models.configkeys import need as _need
from edgeinfer.planning.models.configkeys import opt as _opt
from edgeinfer.planning.models.spec import ModelSpec

DECODERS = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "phi3")
ENCODERS = ("bert", "xlm-roberta")
SUPPORTED = DECODERS + EXTRA_DECODERS + ENCODERS

# safetensors dtype -> bytes per element
ST_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
_TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def spec_from_config(cfg: dict, name: str, source: str) -> ModelSpec:
    """Build a ModelSpec from a config.json dict; parameter counts from the standard formulas."""
    if not isinstance(cfg, dict):
        raise ModelError(f"{source}: config.json is not a JSON object")
    mt = cfg.get("model_type")
    if mt is None:
        raise ModelError(f"{source}: config.json is missing required key 'model_type'",
                         "pass a complete Hugging Face config.json")
    if not isinstance(mt, str):
        raise ModelError(f"{source}: config key 'model_type' must be a string, got {mt!r}")
    if mt == "xlm_roberta":
        mt = "xlm-roberta"
    if mt not in SUPPORTED:
        raise ModelError(f"unsupported model_type '{mt}' in {source}", "supported: " + ", ".join(SUPPORTED))
    if mt in EXTRA_DECODERS:
        return spec_from_extra(cfg, mt, name, source)
    L = layers(cfg, "num_hidden_layers", source)
    h = _need(cfg, "hidden_size", source)
    nh = _need(cfg, "num_attention_heads", source)
    V = _need(cfg, "vocab_size", source)
    inter = _need(cfg, "intermediate_size", source)
    hd = _opt(cfg, "head_dim", source)
    if hd is None:
        if h % nh:
            raise ModelError(f"{source}: hidden_size {h} is not a multiple of num_attention_heads {nh} "
                             "and config.json gives no head_dim", "fix config.json or download it again")
        hd = h // nh
    max_pos = _opt(cfg, "max_position_embeddings", source)
    dtype = _TORCH_DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or ""), None)
    spec = ModelSpec(name=name, source=source, architecture=mt, layers=L, hidden=h, heads=nh,
                     head_dim=hd, intermediate=inter, vocab=V, native_dtype=dtype, max_position=max_pos)
    if mt in ENCODERS:
        spec.encoder = True
        spec.kv_heads = 0
        P = max_pos or 512
        T = _opt(cfg, "type_vocab_size", source, minimum=0)
        T = 2 if T is None else T
        emb_all = V * h + P * h + T * h + 2 * h
        per_layer = 4 * (h * h + h) + (h * inter + inter) + (inter * h + h) + 4 * h
        archs = cfg.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ModelError(f"{source}: config key 'architectures' must be a list of class names, got {archs!r}")
        arch = " ".join(archs)
        if "SequenceClassification" in arch:
            labels = cfg.get("id2label")
            nl = _opt(cfg, "num_labels", source) or (len(labels) if isinstance(labels, dict) else 0) or 1
            head = h * h + h + h * nl + nl
        else:
            head = h * h + h  # pooler (BertModel / XLMRobertaModel)
        spec.embedding_params = V * h
        spec.params_total = emb_all + L * per_layer + head
        spec.params_active = spec.params_total - V * h
        spec.tied_embeddings = True
        return spec
    kv = _opt(cfg, "num_key_value_heads", source) or nh
    if kv > nh or nh % kv:
        raise ModelError(f"{source}: num_key_value_heads {kv} must divide num_attention_heads {nh}",
                         "fix config.json or download it again")
    spec.kv_heads = kv
    tied = bool(cfg.get("tie_word_embeddings", mt == "gemma2"))
    spec.tied_embeddings = tied
    attn = h * nh * hd + 2 * h * kv * hd + nh * hd * h
    if mt == "qwen2" or cfg.get("attention_bias"):
        attn += nh * hd + 2 * kv * hd
    if mt in ("qwen3", "qwen3_moe"):
        attn += 2 * hd  # q_norm, k_norm
    norms = (4 if mt == "gemma2" else 2) * h
    dense_mlp = 3 * h * inter
    total_layers = active_layers = 0
    if mt == "qwen3_moe":
        E = _need(cfg, "num_experts", source)
        k = _need(cfg, "num_experts_per_tok", source)
        mi = _need(cfg, "moe_intermediate_size", source)
        if k > E:
            raise ModelError(f"{source}: num_experts_per_tok {k} is larger than num_experts {E}",
                             "fix config.json or download it again")
        spec.n_experts, spec.experts_per_token, spec.moe_intermediate = E, k, mi
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
            raise ModelError(f"{source}: config key 'mlp_only_layers' must be a list of layer indices, got {only!r}")
        dense_layers = set(only)
        step = _opt(cfg, "decoder_sparse_step", source) or 1
        for i in range(L):
            if i not in dense_layers and (i + 1) % step == 0:
                total_layers += attn + norms + E * 3 * h * mi + h * E
                active_layers += attn + norms + k * 3 * h * mi + h * E
            else:
                total_layers += attn + norms + dense_mlp
                active_layers += attn + norms + dense_mlp
    else:
        total_layers = active_layers = L * (attn + norms + dense_mlp)
    emb = V * h
    spec.embedding_params = emb
    spec.lm_head_params = emb
    spec.params_total = total_layers + h + emb + (0 if tied else emb)
    spec.params_active = active_layers + h + emb  # lm_head is read every token
    sw = _opt(cfg, "sliding_window", source)
    use_sw = cfg.get("use_sliding_window", True)
    # phi3 configs carry sliding_window too, but runtimes keep a full cache: budget the worst case
    if sw and use_sw and mt in ("mistral", "gemma2"):
        spec.sliding_window = int(sw)
        if mt == "gemma2":
            spec.sliding_layers = L // 2  # alternating local/global layers
        else:
            spec.sliding_layers = L
    lt = cfg.get("layer_types")
    if lt is not None and not isinstance(lt, list):
        raise ModelError(f"{source}: config key 'layer_types' must be a list, got {lt!r}")
    if sw and use_sw and isinstance(lt, list):
        n = sum(1 for t in lt if t == "sliding_attention")
        if n:
            spec.sliding_window, spec.sliding_layers = int(sw), n
    return spec


# ------------------------------------------------------------------ safetensors
def read_safetensors_header(path: Path) -> dict:
    """Return the JSON header of a .safetensors file: 8-byte little-endian length + JSON."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{path}: not a valid safetensors file (shorter than 8 bytes)",
                                 "re-download or re-export the file")
            (n,) = struct.unpack("<Q", head)
            if n <= 1 or n > size - 8 or n > 100 * 2**20:
                raise ModelError(f"{path}: not a valid safetensors file (header length {n} does not fit "
                                 f"a {size}-byte file)", "re-download or re-export the file")
            meta = json.loads(f.read(n).decode("utf-8"))
    except ModelError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path}: not a valid safetensors file ({type(e).__name__})",
                         "re-download or re-export the file") from None
    if not isinstance(meta, dict):
        raise ModelError(f"{path}: not a valid safetensors file (header is not a JSON object)")
    end = 0
    for k, v in meta.items():
        if k == "__metadata__":
            if not isinstance(v, dict):
                raise ModelError(f"{path}: not a valid safetensors file (__metadata__ is not a JSON object)",
                                 "re-download or re-export the file")
            continue
        end = max(end, _check_entry(path, k, v))
    if 8 + n + end > size:
        raise ModelError(f"{path}: safetensors file is truncated ({size} bytes, header promises {8 + n + end})",
                         "re-download the file")
    return meta


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**62


def _check_entry(path: Path, name: str, v: object) -> int:
    """One tensor entry of the header, as the format defines it; returns where its data ends.
    (https://github.com/huggingface/safetensors#format: dtype, shape, data_offsets [begin, end))"""
    def bad(why: str) -> ModelError:
        return ModelError(f"{path}: not a valid safetensors file (tensor '{name}': {why})",
                          "re-download or re-export the file")

    if not isinstance(v, dict) or not {"dtype", "shape", "data_offsets"} <= set(v):
        raise bad("entry needs dtype, shape and data_offsets")
    dtype, shape, offsets = v["dtype"], v["shape"], v["data_offsets"]
    if not isinstance(dtype, str) or dtype not in ST_DTYPES:
        raise bad(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise bad(f"shape {shape!r} is not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise bad(f"data_offsets {offsets!r} is not [begin, end] in bytes")
    begin, end = offsets
    n = 1
    for d in shape:
        n *= d
    if end - begin != n * ST_DTYPES[dtype]:
        raise bad(f"data_offsets span {end - begin} bytes, shape {shape} of {dtype} needs {n * ST_DTYPES[dtype]}")
    return end


def safetensors_tensors(files: list[Path]) -> dict[str, tuple[str, int, int]]:
    """name -> (dtype, n_elements, bytes) over one or several shards."""
    out: dict[str, tuple[str, int, int]] = {}
    for p in files:
        for k, v in read_safetensors_header(p).items():
            if k == "__metadata__":
                continue
            n = 1
            for d in v["shape"]:
                n *= int(d)
            out[k] = (v["dtype"], n, int(v["data_offsets"][1]) - int(v["data_offsets"][0]))
    return out


def _is_embedding(name: str) -> bool:
    return any(s in name for s in ("embed_tokens", "word_embeddings", "wte.", "tok_embeddings"))


def apply_tensors(spec: ModelSpec, tensors: dict[str, tuple[str, int, int]], fmt: str) -> ModelSpec:
    """Replace formula counts with exact per-tensor facts from a file."""
    spec.file_format = fmt
    spec.tensor_bytes = {k: b for k, (_, _, b) in tensors.items()}
    types: dict[str, int] = {}
    for _, (dt, _, b) in tensors.items():
        types[dt] = types.get(dt, 0) + b
    spec.tensor_types = types
    spec.file_weight_bytes = sum(spec.tensor_bytes.values())
    total = sum(n for (_, n, _) in tensors.values())
    emb = sum(n for k, (_, n, _) in tensors.items() if _is_embedding(k))
    head = sum(n for k, (_, n, _) in tensors.items() if k.startswith("lm_head"))
    if total:
        if spec.layers and spec.params_total and abs(total - spec.params_total) / spec.params_total > 0.02:
            spec.notes.append(f"file holds {total} parameters, config formula gives {spec.params_total}")
        diff = total - spec.params_total
        spec.params_total = total
        spec.params_active = max(0, spec.params_active + diff) if spec.params_active else total
        if emb:
            spec.embedding_params = emb
        if head:
            spec.lm_head_params = head
            spec.tied_embeddings = False
    dominant = max(types, key=types.get) if types else None
    spec.native_dtype = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "I8": "w8a16"}.get(dominant or "",
                                                                                          spec.native_dtype)
    spec.file_scheme = spec.native_dtype
    return spec


def read_config(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path}: cannot read config.json ({type(e).__name__})",
                         "pass a valid Hugging Face config.json") from None


def read_hf_dir(path: Path, name: str | None = None) -> ModelSpec:
    """A directory holding config.json (and optionally *.safetensors, sharded or not)."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file() and (path / "manifest.json").is_file():
        raise ModelError(f"{path} is a bundle (edgeinfer deploy's output): the plan it was built with is in its "
                         "manifest.json (\"plan\")", "plan the model it was deployed from: edgeinfer plan MODEL "
                         "--board BOARD")
    if not cfg_path.is_file():
        raise ModelError(f"{path}: no config.json in this directory",
                         "pass a Hugging Face model directory, a .gguf, .onnx or .safetensors file")
    cfg = read_config(cfg_path)
    files = _safetensors_files(path)
    try:
        spec = spec_from_config(cfg, name or path.name, str(path))
    except ModelError as e:
        if not files or not str(e).startswith("unsupported model_type"):
            raise
        spec = spec_from_shapes(cfg, safetensors_shapes(files), name or path.name, str(path))
    if files:
        apply_tensors(spec, safetensors_tensors(files), "safetensors")
    return spec


def safetensors_shapes(files: list[Path]) -> dict[str, list[int]]:
    return {k: list(v["shape"]) for p in files for k, v in read_safetensors_header(p).items()
            if k != "__metadata__"}


def _safetensors_files(path: Path) -> list[Path]:
    """The shards a model.safetensors.index.json lists, else every *.safetensors in ``path``."""
    index = path / "model.safetensors.index.json"
    files: list[Path] = []
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(wm.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelError(f"{index}: not a valid safetensors index", "re-download the model") from None
        if not all(isinstance(f, str) and f and "/" not in f and "\\" not in f and f not in (".", "..")
                   for f in names):
            raise ModelError(f"{index}: weight_map must name shard files in this directory, got {names[:3]}",
                             "re-download the model")
        files = [path / f for f in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelError(f"{path}: shards listed in the index are missing: {', '.join(missing[:3])}",
                             "download all shards or remove the index")
    else:
        files = sorted(path.glob("*.safetensors"))
    return files


def read_safetensors_file(path: Path) -> ModelSpec:
    tensors = safetensors_tensors([path])
    cfg = path.parent / "config.json"
    if cfg.is_file():
        spec = spec_from_config(read_config(cfg), path.parent.name, str(path))
    else:
        spec = ModelSpec(name=path.stem, source=str(path), architecture="unknown")
        spec.notes.append("no config.json next to the file: KV cache and activations are not modelled")
    return apply_tensors(spec, tensors, "safetensors")
