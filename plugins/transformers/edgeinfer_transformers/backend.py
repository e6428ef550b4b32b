"""The decoders' reference: a Hugging Face causal LM in fp32, eager, on torch CPU.

Each slot owns a transformers ``StaticCache`` of ``context`` positions, allocated
at load (``early_initialization``), so the KV bytes are known before the first
token and never grow. The slots' caches are rows of one tensor per layer, so a
decode step runs every asked slot in one batched forward (each row at its own
position, through an explicit 4-D attention mask). Greedy decoding here gives the same tokens as
``model.generate(do_sample=False)`` (tested), which is what the golden check of
every other backend compares against.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import Backend, Decoders, OpTime, Probe, Problem, StepDecoder, Tensors, remote_code
from edgeinfer.contract.helpers import check_weight_index
from edgeinfer.contract.native_output import native_output
from edgeinfer.errors import InputError, ModelError

if TYPE_CHECKING:
    import numpy as np

DTYPES = ("float32", "bfloat16", "float16")


class TransformersBackend(Backend):
    name = "transformers"
    tensors = Tensors(sources=("hf",))
    decoders = Decoders(options=("dtype", "threads"))  # runs any architecture transformers does; exports none

    def probe(self) -> Probe:
        versions, problems = {}, []
        for dist in ("torch", "transformers", "tokenizers"):
            try:
                versions[dist] = version(dist)
            except Exception:
                problems.append(Problem(f"{dist} is not installed", f"pip install {dist}"))
        return Probe(available=not problems, versions=versions, devices=["CPU"] if not problems else [],
                     problems=problems, details={"mode": "reference (fp32, eager, torch CPU)"})

    def versions(self) -> dict[str, str]:
        return {"toolkit": f"transformers {version('transformers')}"}

    @native_output()
    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any) -> StepDecoder:
        if device not in (None, "", "cpu", "CPU"):
            raise InputError(f"the transformers reference runs on CPU only, not {device!r}; omit --device")
        dtype = options.pop("dtype", "float32")
        threads = options.pop("threads", None)
        if dtype not in DTYPES:
            raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if not (model.is_dir() and (model / "config.json").is_file()):
            raise ModelError(f"{model} is not a Hugging Face model directory (no config.json)")
        check_weight_index(model)
        return TransformersDecoder(model, context, slots, dtype, threads)


class TransformersDecoder(StepDecoder):
    def __init__(self, model_dir: Path, context: int, slots: int, dtype: str, threads: int | None):
        import inspect
        import logging

        trust = remote_code.allowed(model_dir)  # refused before torch is imported
        import torch

        # transformers imports torchao when it is installed; its optional CUDA kernels log load failures
        logging.getLogger("torchao").setLevel(logging.ERROR)
        from transformers import AutoModelForCausalLM, StaticCache
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype),
                                                          trust_remote_code=trust)
        self.model.eval()
        cfg = self.model.config
        limit = getattr(cfg, "max_position_embeddings", None)
        if isinstance(limit, int) and context > limit:
            raise InputError(f"context {context} exceeds the model's max_position_embeddings ({limit}); use --ctx "
                             f"{limit}")
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.caches = []
        for s in range(slots):
            cache = StaticCache(config=cfg, max_cache_len=context)
            cache.early_initialization(1, kv_heads, head_dim, self.model.dtype, torch.device("cpu"))
            self.caches.append(cache)
        # one [slots, heads, context, dim] tensor per layer; slot s's cache holds views of row s
        self.keys = [torch.cat([c.layers[i].keys for c in self.caches]) for i in range(len(self.caches[0].layers))]
        self.values = [torch.cat([c.layers[i].values for c in self.caches]) for i in range(len(self.keys))]
        for s, c in enumerate(self.caches):
            for i, layer in enumerate(c.layers):
                layer.keys, layer.values = self.keys[i][s : s + 1], self.values[i][s : s + 1]
        self.lengths = [0] * slots
        # transformers 5.24 renamed the cache argument; older releases (pinned by optimum-intel) still call it
        # past_key_values
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        kv = sum(t.nbytes for t in (*self.keys, *self.values))
        super().__init__(context=context, vocab_size=cfg.vocab_size, kv_cache_bytes=int(kv), slots=slots,
                         device="CPU")
        self._warm_up()

    def _warm_up(self) -> None:
        """One prefill and one decode step, so the first request does not pay for lazy initialisation."""
        import numpy as np
        ids = np.zeros(2, dtype=np.int64)
        self.prefill(0, ids[:1])
        self.decode([0], ids[1:])
        self.reset(0)

    def _forward(self, slot: int, ids: np.ndarray) -> Any:
        import numpy as np
        torch = self.torch
        n, start = int(ids.shape[0]), self.lengths[slot]
        if start + n > self.context:
            raise InputError(f"slot {slot}: {start + n} positions exceed the context of {self.context}")
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))[None],
                **{self._cache_arg: self.caches[slot]},
                cache_position=torch.arange(start, start + n),
                use_cache=True,
            )
        self.lengths[slot] = start + n
        return out.logits[0, -1].float().numpy()

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        return self._forward(slot, token_ids)

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        """One token for each of ``slots`` in a single forward: the new keys/values go to each row's own
        position, attention reads each row's first ``length + 1`` positions."""
        import numpy as np
        torch = self.torch
        lengths = [self.lengths[s] for s in slots]
        for s, n in zip(slots, lengths):
            if n + 1 > self.context:
                raise InputError(f"slot {s}: {n + 1} positions exceed the context of {self.context}")
        pos = torch.tensor(lengths, dtype=torch.long)
        span = max(lengths) + 1
        allowed = torch.arange(span)[None, :] <= pos[:, None]
        low = torch.finfo(self.model.dtype).min
        mask = torch.zeros(allowed.shape, dtype=self.model.dtype).masked_fill_(~allowed, low)
        cache = _RowsCache(self.keys, self.values, list(slots), pos, span)
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64)).reshape(-1, 1),
                **{self._cache_arg: cache},
                attention_mask=mask[:, None, None, :],
                position_ids=pos[:, None],
                use_cache=True,
            )
        for s in slots:
            self.lengths[s] += 1
            for layer in self.caches[s].layers:
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                    layer.cumulative_length.add_(1)
        return out.logits[:, -1].float().numpy()

    def reset(self, slot: int) -> None:
        self.caches[slot].reset()
        self.lengths[slot] = 0

    def op_times(self, phase: str, token_ids: np.ndarray) -> list[OpTime]:
        from torch.profiler import ProfilerActivity, profile

        self.reset(0)
        if phase == "decode":
            self.prefill(0, token_ids[:-1] if len(token_ids) > 1 else token_ids)
            token_ids = token_ids[-1:]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            self._forward(0, token_ids)
        self.reset(0)
        rows = [OpTime(e.key, e.key, e.self_cpu_time_total / 1e3, "CPU") for e in prof.key_averages()]
        return sorted(rows, key=lambda r: r.time_ms, reverse=True)

    def release(self) -> None:
        self.caches, self.keys, self.values = [], [], []
        self.model = None


class _RowsCache:
    """The cache seen by one batched decode step: row ``i`` of the batch is slot ``rows[i]``, writing its
    new key/value at ``positions[i]`` and attending over the first ``span`` positions (the 4-D mask hides
    what lies past each row's own length)."""

    is_compileable = False

    def __init__(self, keys: list[Any], values: list[Any], rows: list[int], positions: Any, span: int):
        import torch

        self.keys, self.values, self.positions, self.span = keys, values, positions, span
        first = rows[0]
        contiguous = rows == list(range(first, first + len(rows)))
        self.rows: Any = slice(first, first + len(rows)) if contiguous else torch.tensor(rows, dtype=torch.long)
        self.index = torch.tensor(rows, dtype=torch.long)

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> tuple:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[self.index, :, self.positions] = key_states[:, :, 0]
        v[self.index, :, self.positions] = value_states[:, :, 0]
        return k[self.rows, :, : self.span], v[self.rows, :, : self.span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.span - 1
