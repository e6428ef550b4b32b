"""The decoders' reference: a Hugging Face causal LM in fp32, eager, on torch CPU.

Each slot owns a transformers ``StaticCache`` of ``context`` positions, allocated
at load (``early_initialization``), so the KV bytes are known before the first
token and never grow. Greedy decoding here gives the same tokens as
``model.generate(do_sample=False)`` (tested), which is what the golden check of
every other backend compares against.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import Backend, Decoder, OpTime, Probe, Problem
from edgeinfer.errors import InputError, ModelError

DTYPES = ("float32", "bfloat16", "float16")


class TransformersBackend(Backend):
    name = "transformers"
    source_formats = ("hf",)
    schemes = ("fp32",)
    default_scheme = "fp32"

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
        return {"toolkit": version("transformers")}

    decoder_options = ("dtype", "threads")

    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any) -> Decoder:
        if device not in (None, "", "cpu", "CPU"):
            raise InputError(f"the transformers reference runs on CPU only, not {device!r}; omit --device")
        dtype = options.pop("dtype", "float32")
        threads = options.pop("threads", None)
        if dtype not in DTYPES:
            raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if not (model.is_dir() and (model / "config.json").is_file()):
            raise ModelError(f"{model} is not a Hugging Face model directory (no config.json)")
        return TransformersDecoder(model, context, slots, dtype, threads)


class TransformersDecoder(Decoder):
    def __init__(self, model_dir: Path, context: int, slots: int, dtype: str, threads: int | None):
        import inspect
        import logging

        import torch

        # transformers imports torchao when it is installed; its optional CUDA kernels log load failures
        logging.getLogger("torchao").setLevel(logging.ERROR)
        from transformers import AutoModelForCausalLM, StaticCache
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
        self.model.eval()
        cfg = self.model.config
        limit = getattr(cfg, "max_position_embeddings", None)
        if isinstance(limit, int) and context > limit:
            raise InputError(f"context {context} exceeds the model's max_position_embeddings ({limit}); use --ctx "
                             f"{limit}")
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.caches = []
        for _ in range(slots):
            cache = StaticCache(config=cfg, max_cache_len=context)
            cache.early_initialization(1, kv_heads, head_dim, self.model.dtype, torch.device("cpu"))
            self.caches.append(cache)
        self.lengths = [0] * slots
        # transformers 5.24 renamed the cache argument; older releases (pinned by optimum-intel) still call it
        # past_key_values
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        kv = sum(t.nbytes for c in self.caches for layer in c.layers for t in (layer.keys, layer.values))
        super().__init__(context=context, vocab_size=cfg.vocab_size, kv_cache_bytes=int(kv), slots=slots,
                         device="CPU")
        self._warm_up()

    def _warm_up(self) -> None:
        """One prefill and one decode step, so the first request does not pay for lazy initialisation."""
        ids = np.zeros(2, dtype=np.int64)
        self.prefill(0, ids[:1])
        self.decode([0], ids[1:])
        self.reset(0)

    def _forward(self, slot: int, ids: np.ndarray) -> Any:
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
        return np.stack([self._forward(s, token_ids[i : i + 1]) for i, s in enumerate(slots)])

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
        self.caches = []
        self.model = None
