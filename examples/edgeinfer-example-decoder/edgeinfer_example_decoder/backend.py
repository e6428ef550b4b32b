"""The smallest complete decoder backend: a Hugging Face causal LM in fp32 on torch CPU, given to edgeinfer as
step primitives (``StepDecoder``: prefill, decode, reset). edgeinfer runs the loop around them — sampling,
stopping, chat templates, streaming, metrics, ``generate`` / ``chat`` / ``serve`` — and the core checks
options, the device, the context and a model directory's own code before ``open_decoder`` is called.

Each slot (one sequence) keeps a transformers ``DynamicCache`` that grows with the sequence, at most
``context`` positions; a decode step runs the asked slots one after another. A backend for an accelerator
would allocate its KV cache once at load and decode the slots in one batched call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import Backend, Decoders, Probe, Problem, StepDecoder, remote_code
from edgeinfer.contract.helpers import check_device, package_version
from edgeinfer.errors import InputError

if TYPE_CHECKING:
    import numpy as np

FP32_BYTES = 4


class ExampleDecoderBackend(Backend):
    name = "example-decoder"
    # decoders only (no tensors record: no convert / open); open_decoder takes one option, `threads`
    decoders = Decoders(options=("threads",))

    def probe(self) -> Probe:
        versions = {d: package_version(d) for d in ("torch", "transformers")}
        missing = [d for d, v in versions.items() if v is None]
        if missing:
            return Probe(False, problems=[Problem(f"{' and '.join(missing)} not installed",
                                                  "pip install torch transformers")])
        return Probe(True, versions=versions, devices=["CPU"])

    def versions(self) -> dict[str, str]:
        return {"toolkit": f"transformers {package_version('transformers', 'missing')}"}

    def open_decoder(self, model: Path, device: str | None, context: int, slots: int,
                     **options: Any) -> StepDecoder:
        check_device(device, ("cpu",), self.name)  # anything else: a one-line InputError naming it
        return ExampleDecoder(model, context, slots, options.get("threads"))


class ExampleDecoder(StepDecoder):
    def __init__(self, model_dir: Path, context: int, slots: int, threads: int | None):
        trust = remote_code.allowed(model_dir)  # the user's --trust-remote-code, passed on explicitly
        import torch
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                          trust_remote_code=trust).eval()
        cfg = self.model.config
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        # what the caches hold at their fullest: keys and values of every layer, `context` positions per slot
        kv_bytes = cfg.num_hidden_layers * 2 * kv_heads * head_dim * context * FP32_BYTES * slots
        super().__init__(context=context, vocab_size=cfg.vocab_size, kv_cache_bytes=kv_bytes, slots=slots,
                         device="CPU")
        self.caches: list[Any] = [None] * slots
        self.lengths = [0] * slots

    def _forward(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        """Append ``token_ids`` to ``slot``'s cache; the last position's logits."""
        from transformers import DynamicCache

        torch, n = self.torch, len(token_ids)
        if self.lengths[slot] + n > self.context:
            raise InputError(f"slot {slot}: {self.lengths[slot] + n} positions exceed the context of {self.context}")
        if self.caches[slot] is None:
            self.caches[slot] = DynamicCache(config=self.model.config)
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(1, n)
        with torch.inference_mode():
            out = self.model(input_ids=ids, past_key_values=self.caches[slot], use_cache=True)
        self.lengths[slot] += n
        return out.logits[0, -1].float().numpy()

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        return self._forward(slot, token_ids)

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        import numpy as np

        return np.stack([self._forward(s, token_ids[i : i + 1]) for i, s in enumerate(slots)])

    def reset(self, slot: int) -> None:
        self.caches[slot], self.lengths[slot] = None, 0

    def release(self) -> None:
        self.caches, self.model = [], None
