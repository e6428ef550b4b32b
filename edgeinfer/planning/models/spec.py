"""ModelSpec: the architecture facts the planner needs, from any reader."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ModelSpec:
    name: str
    source: str  # where the facts come from (catalog URL, file path)
    architecture: str  # HF model_type or GGUF general.architecture ("onnx" when unknown)
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    vocab: int = 0
    tied_embeddings: bool = False
    encoder: bool = False
    n_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0  # how many layers use the sliding window
    max_position: int | None = None
    kv_row: int = 0  # elements cached per token per layer (K and V together) when not 2 × kv_heads × head_dim (MLA)
    vision_params: int = 0  # vision encoder + projector (in params_total, never read per decode token)
    vision: dict = field(default_factory=dict)  # vision encoder shape facts (planning/models/vision.py)
    vision_activation_bytes: int = 0  # vision encoder buffers for the stated image size (0: no image planned)
    params_total: int = 0  # every stored parameter (embedding + lm_head when untied)
    params_active: int = 0  # read per decode token: non-embedding (active experts) + lm_head
    embedding_params: int = 0  # token-embedding lookup table
    lm_head_params: int = 0  # output projection (== embedding_params when tied)
    native_dtype: str | None = None  # torch_dtype / dominant file dtype
    file_format: str | None = None  # "safetensors", "gguf", "onnx", or None (catalog / config only)
    file_weight_bytes: int | None = None  # exact bytes of the stored weights
    file_scheme: str | None = None  # scheme the file is stored in ("fp16", "gguf:Q4_K_M" ...)
    runtime: str | None = None  # the one board runtime that runs the file (a vendor toolkit's: "rkllm")
    tensor_bytes: dict[str, int] = field(default_factory=dict)  # per tensor, when a file gives it
    tensor_types: dict[str, int] = field(default_factory=dict)  # type name -> bytes (summary)
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def has_kv(self) -> bool:
        return not self.encoder and self.layers > 0 and self.kv_heads > 0

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def kv_elements(self) -> int:
        """Elements cached per token in one layer: K and V (2 × kv_heads × head_dim) unless the
        architecture caches something else (MLA: the compressed latent + the rope key)."""
        return self.kv_row or 2 * self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_elem: float = 2.0) -> float:
        """layers × kv_elements × bytes (every layer at full context); 0 for encoders."""
        if not self.has_kv:
            return 0.0
        return self.layers * self.kv_elements * bytes_per_elem

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("tensor_bytes")
        d["n_tensors"] = len(self.tensor_bytes)
        return d
