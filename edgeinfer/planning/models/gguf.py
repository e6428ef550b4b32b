"""GGUF reader: architecture metadata and exact per-tensor bytes (the `gguf` package, imported lazily)."""

from __future__ import annotations

from pathlib import Path

from edgeinfer.errors import ModelError
from edgeinfer.planning.models.configkeys import MAX_LAYERS
from edgeinfer.planning.models.spec import ModelSpec

_FTYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
                11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
                17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def _field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        v = f.contents()
    except Exception:  # older gguf versions
        v = f.parts[f.data[0]].tolist()
        v = v[0] if len(v) == 1 else v
    return v


def _count(v, key: str, path: Path) -> int:
    """A metadata value that counts something: a non-negative integer, else the file is refused."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**40:
        raise ModelError(f"{path}: GGUF metadata '{key}' must be a non-negative integer, got {v!r}",
                         "re-download or re-convert the file")
    return v


def read_gguf(path: Path) -> ModelSpec:
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise ModelError(f"{path}: cannot read file ({e.strerror})") from None
    if magic != b"GGUF":
        raise ModelError(f"{path}: not a GGUF file (bad magic {magic!r})", "pass a valid .gguf file")
    try:
        import gguf  # noqa: PLC0415 - lazy on purpose
    except ImportError:
        raise ModelError("reading .gguf files needs the 'gguf' package", "pip install gguf") from None
    try:
        reader = gguf.GGUFReader(str(path), "r")
        tensors = list(reader.tensors)
        arch = _field(reader, "general.architecture") or "unknown"
        arch = str(arch)

        def a(key, default=0):
            v = _field(reader, f"{arch}.{key}")
            if isinstance(v, list):  # per-layer arrays (e.g. head_count_kv): take the max
                if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                    raise ModelError(f"{path}: GGUF metadata '{arch}.{key}' must hold integers, got {v[:4]!r}",
                                     "re-download or re-convert the file")
                v = max(v) if v else default
            return default if v is None else _count(v, f"{arch}.{key}", path)

        layers = a("block_count")
        hidden = a("embedding_length")
        heads = a("attention.head_count")
        kv = a("attention.head_count_kv", heads)
        key_len = a("attention.key_length", (hidden // heads) if heads else 0)
        inter = a("feed_forward_length")
        experts = a("expert_count")
        used = a("expert_used_count")
        ctx = a("context_length", None)
        swa = a("attention.sliding_window", None)
        if layers > MAX_LAYERS:
            raise ModelError(f"{path}: GGUF metadata gives {layers} layers, not a real layer count",
                             "re-download or re-convert the file")
        if layers and (not heads or not hidden):
            raise ModelError(f"{path}: GGUF metadata gives {layers} layers but {heads} attention heads and "
                             f"embedding length {hidden}", "re-download or re-convert the file")
        if kv > heads:
            raise ModelError(f"{path}: GGUF metadata gives more KV heads ({kv}) than attention heads ({heads})",
                             "re-download or re-convert the file")
        ftype = _field(reader, "general.file_type")
        name = _field(reader, "general.name") or path.stem
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else 0
        per: dict[str, int] = {}
        types: dict[str, int] = {}
        counts: dict[str, int] = {}
        for t in tensors:
            nb = int(t.n_bytes)
            per[t.name] = nb
            tn = t.tensor_type.name
            types[tn] = types.get(tn, 0) + nb
            counts[t.name] = int(t.n_elements)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in tensors), default=0)
    except ModelError:
        raise
    except Exception as e:  # the gguf package raises many kinds on bad input
        raise ModelError(f"{path}: not a valid GGUF file ({type(e).__name__}: {str(e)[:80]})",
                         "re-download or re-convert the file") from None
    if end > size:
        raise ModelError(f"{path}: GGUF file is truncated ({size} bytes, tensors end at {end})",
                         "re-download the file")
    spec = ModelSpec(name=str(name), source=str(path), architecture=arch, layers=layers, hidden=hidden,
                     heads=heads, kv_heads=kv, head_dim=key_len, intermediate=inter, vocab=vocab,
                     n_experts=experts, experts_per_token=used,
                     max_position=int(ctx) if ctx else None, file_format="gguf")
    if arch in ("bert", "nomic-bert", "jina-bert-v2", "t5encoder"):
        spec.encoder = True
        spec.kv_heads = 0
    if swa:
        spec.sliding_window = int(swa)
        spec.sliding_layers = layers // 2 if arch.startswith("gemma") else layers
    spec.tensor_bytes = per
    spec.tensor_types = types
    spec.file_weight_bytes = sum(per.values())
    spec.params_total = sum(counts.values())
    emb = counts.get("token_embd.weight", 0)
    head = counts.get("output.weight", 0)
    spec.embedding_params = emb
    spec.tied_embeddings = head == 0
    spec.lm_head_params = head or emb
    if not vocab and emb and hidden:
        spec.vocab = emb // hidden
    active = spec.params_total - emb + spec.lm_head_params * (1 if spec.tied_embeddings else 0)
    if experts and used:
        exp = sum(n for k, n in counts.items() if "_exps" in k)
        active -= exp - exp * used // experts
        spec.moe_intermediate = _count(_field(reader, f"{arch}.expert_feed_forward_length") or 0,
                                       "expert_feed_forward_length", path)
    spec.params_active = active
    ft = _FTYPE_NAMES.get(ftype) if isinstance(ftype, int) and not isinstance(ftype, bool) else None
    ft = ft or (max(types, key=types.get) if types else None)
    spec.file_scheme = None
    if ft:
        from edgeinfer.contract.schemes import normalize_scheme
        from edgeinfer.errors import InputError

        try:
            spec.file_scheme = normalize_scheme(ft).name
        except InputError:
            spec.file_scheme = f"gguf:{ft}"
    spec.native_dtype = spec.file_scheme
    return spec
