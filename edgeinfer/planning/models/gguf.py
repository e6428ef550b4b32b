"""GGUF reader: architecture metadata and exact per-tensor bytes, from the file's header alone."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from edgeinfer.errors import ModelError
from edgeinfer.planning.models.configkeys import MAX_LAYERS
from edgeinfer.planning.models.spec import ModelSpec

_FTYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
                11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
                17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


# ggml_type id → (name, elements per block, bytes per block): ggml's type traits
# (https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml.c, `type_traits`), the names of the gguf
# package's GGMLQuantizationType (tests/test_model_readers.py holds the two equal)
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
              7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84),
              11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
              15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
              19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
              23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
              28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
              35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18)}

# GGUF metadata value types (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, "File Structure")
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_SMALL_ARRAY = 65_536  # per-layer arrays are decoded; larger ones (a tokenizer's) are only counted


class _Bad(Exception):
    """The file breaks the GGUF layout (read_gguf turns it into a ModelError)."""


class _Array(list):
    """A metadata array: its values where small and numeric, else empty; ``count`` is its length either way."""

    def __init__(self, count: int, values=()):
        super().__init__(values)
        self.count = count


class _Header:
    """A GGUF file's metadata and tensor table, read with ``struct`` from a memory map: only the header is
    touched, and the tokenizer's large arrays are skipped rather than decoded (no numpy, no gguf package)."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 4
        version = struct.unpack_from("<I", self.buf, self._take(4))[0]
        self.e = "<"
        if version & 0xFFFF == 0:  # written big-endian
            self.e, version = ">", int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in (2, 3):
            raise _Bad(f"GGUF version {version} (this reader knows versions 2 and 3)")
        n_tensors, n_kv = self._room(self._get("Q"), 24), self._room(self._get("Q"), 12)
        self.fields: dict = {}
        for _ in range(n_kv):
            key = self._str()
            self.fields[key] = self._value(self._get("I"))
        self.tensors: list[tuple[str, int, int, int]] = []  # name, ggml type, elements, offset in the data
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._get("I")
            if n_dims > 8:
                raise _Bad(f"tensor {name!r} has {n_dims} dimensions")
            n = 1
            for _ in range(n_dims):
                n *= self._get("Q")
            self.tensors.append((name, self._get("I"), n, self._get("Q")))
        align = self.fields.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0:
            raise _Bad(f"general.alignment {align!r}")
        self.data_start = -(-self.pos // align) * align
        self.buf = None  # the map closes after the header is read

    def _take(self, n: int) -> int:
        """Advance over ``n`` bytes; where they started."""
        at = self.pos
        if n < 0 or at + n > self.size:
            raise _Bad(f"a field runs past the end of the file (at byte {at})")
        self.pos = at + n
        return at

    def _room(self, count: int, least: int) -> int:
        """``count`` entries of at least ``least`` bytes each, if the rest of the file can hold them: a corrupt
        count fails here rather than after a loop over the whole file."""
        if count * least > self.size - self.pos:
            raise _Bad(f"{count} entries cannot fit the {self.size - self.pos} bytes left (at byte {self.pos})")
        return count

    def _get(self, code: str):
        return struct.unpack_from(self.e + code, self.buf, self._take(struct.calcsize(code)))[0]

    def _str(self) -> str:
        n = self._get("Q")
        return bytes(self.buf[self._take(n):self.pos]).decode("utf-8", "replace")

    def _value(self, kind: int):
        if kind in _SCALARS:
            return self._get(_SCALARS[kind])
        if kind == _STRING:
            return self._str()
        if kind != _ARRAY:
            raise _Bad(f"metadata value type {kind}")
        kind, count = self._get("I"), self._get("Q")
        if kind in _SCALARS:
            code = _SCALARS[kind]
            at = self._take(count * struct.calcsize(code))
            if count > _SMALL_ARRAY:
                return _Array(count)
            return _Array(count, struct.unpack_from(f"{self.e}{count}{code}", self.buf, at))
        if kind == _STRING:
            for _ in range(self._room(count, 8)):
                self._take(self._get("Q"))
            return _Array(count)
        raise _Bad(f"array of metadata value type {kind}")


def _field(header: _Header, key: str):
    v = header.fields.get(key)
    return list(v) if isinstance(v, _Array) else v


def _count(v, key: str, path: Path) -> int:
    """A metadata value that counts something: a non-negative integer, else the file is refused."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**40:
        raise ModelError(f"{path}: GGUF metadata '{key}' must be a non-negative integer, got {v!r}",
                         "re-download or re-convert the file")
    return v


def _read_header(path: Path) -> _Header:
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                fh.seek(0)
                raise ModelError(f"{path}: not a GGUF file (bad magic {fh.read(4)!r})", "pass a valid .gguf file")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _Header(buf, len(buf))
    except OSError as e:
        raise ModelError(f"{path}: cannot read file ({e.strerror})") from None
    except (_Bad, struct.error, OverflowError) as e:
        raise ModelError(f"{path}: not a valid GGUF file ({str(e)[:80]})",
                         "re-download or re-convert the file") from None


def read_gguf(path: Path) -> ModelSpec:
    reader = _read_header(path)
    size = reader.size
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
    vocab = tokens.count if isinstance(tokens, _Array) else 0
    per: dict[str, int] = {}
    types: dict[str, int] = {}
    counts: dict[str, int] = {}
    end = 0
    for tname, kind, n, offset in reader.tensors:
        if kind not in GGML_TYPES:
            raise ModelError(f"{path}: tensor {tname!r} has ggml type {kind}, which this reader does not know",
                             "convert the file with a llama.cpp release of this edgeinfer's, or update edgeinfer")
        tn, block_n, block_bytes = GGML_TYPES[kind]
        if n % block_n:
            raise ModelError(f"{path}: tensor {tname!r} has {n} elements, not whole {tn} blocks of {block_n}",
                             "re-download or re-convert the file")
        per[tname] = nb = n // block_n * block_bytes
        types[tn] = types.get(tn, 0) + nb
        counts[tname] = n
        end = max(end, reader.data_start + offset + nb)
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
