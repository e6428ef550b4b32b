"""The Ascend session: an opened ``.ascend`` artifact run on an NPU (or the CPU), padded to shape buckets."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import OpTime, Session, TensorSpec
from edgeinfer.errors import InputError

from . import buckets as bk
from . import convert
from . import device as dev
from .convert import torchao

if TYPE_CHECKING:
    import numpy as np

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)

class AscendSession(Session):
    def __init__(
        self,
        manifest: dict[str, Any],
        blobs: dict[str, bytes],
        device: str,
        dtype: str | None = None,
        compile: Any = False,
        compile_backend: str | None = None,
        seq_buckets: Any = None,
        batch_buckets: Any = None,
        warmup: Any = "auto",
        threads: int | None = None,
    ):
        import torch

        self._torch = torch
        self.kind = manifest["kind"]
        self.manifest = manifest
        if threads:
            torch.set_num_threads(int(threads))
        self.dtype = (dtype or manifest["dtype"]).lower()
        self.dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(self.dtype, self.dtype)
        if self.dtype not in DTYPES:
            raise InputError(f"dtype must be one of fp32, fp16, bf16, got {dtype!r}")
        dev.set_device(device)
        inputs = [TensorSpec.from_json(s) for s in manifest["inputs"]]
        outputs = [TensorSpec.from_json(s) for s in manifest["outputs"]]
        super().__init__(inputs, outputs, device=device)
        if self.kind == "hf":
            state = convert.load_safetensors_bytes(blobs["model.safetensors"])
            module = convert.build_hf(manifest["config"], state)
            if manifest.get("quant"):
                quantize_, config = torchao()
                module = module.float()
                quantize_(module, config())
            self.seq_buckets = bk.parse_buckets(seq_buckets, "seq_buckets", bk.DEFAULT_SEQ_BUCKETS)
            self.batch_buckets = bk.parse_buckets(batch_buckets, "batch_buckets", bk.DEFAULT_BATCH_BUCKETS)
        else:
            module = convert.load_program(blobs["program.pt2"]).module()
            self.seq_buckets, self.batch_buckets = (), ()
        if manifest.get("quant"):
            module = module.to(device)
        else:
            module = module.to(device=device, dtype=torch_dtype(self.dtype))
        if self.kind == "hf":
            module = module.eval()  # an exported program's module has no train/eval switch
        self.module = module
        self.pad_id = int(manifest.get("pad_token_id", 0) or 0)
        self.compiled = _truthy(compile)
        default = "torchair" if dev.is_npu(device) else "inductor"
        self.compile_backend_name = compile_backend or default if self.compiled else None
        self.compiles: dict[str, int] = defaultdict(int)  # bucket key -> backend invocations
        self._current = "unbucketed"
        self._fn = self.module
        if self.compiled:
            inner = dev.compile_backend(device, compile_backend)
            if isinstance(inner, str):
                from torch._dynamo.backends.registry import lookup_backend

                inner = lookup_backend(inner)

            def counting_backend(gm, example_inputs):
                self.compiles[self._current] += 1
                return inner(gm, example_inputs)

            self._fn = torch.compile(self.module, backend=counting_backend, dynamic=False,
                                     fullgraph=self.kind == "hf")
        self.warmup_ms: dict[str, dict[str, float]] = {}
        # auto: warm up where first runs are expensive (graph compile, CANN operator compile on NPU)
        want = (self.compiled or dev.is_npu(device)) if str(warmup).lower() == "auto" else _truthy(warmup)
        self.warmup = want
        if want and self.kind == "hf" and self.seq_buckets and self.batch_buckets:
            self._warm_up()

    # --- running ----------------------------------------------------------------------------
    def _forward(self, feeds: dict[str, np.ndarray], key: str) -> list[np.ndarray]:
        import numpy as np
        torch = self._torch
        self._current = key
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in feeds.items()}
        with torch.inference_mode():
            if self.kind == "hf":
                out = self._fn(**tensors)
                results = [getattr(out, self.outputs[0].name)]  # last_hidden_state, or a classifier's logits
            else:
                args = [tensors[s.name] for s in self.inputs]
                args = [a.to(torch_dtype(self.dtype)) if a.is_floating_point() else a for a in args]
                out = self._fn(*args)
                results = list(out) if isinstance(out, (tuple, list)) else [out]
            dev.synchronize(self.device)
            return [r.detach().float().cpu().numpy() for r in results]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import numpy as np
        names = [o.name for o in self.outputs]
        if self.kind != "hf" or not (self.seq_buckets or self.batch_buckets):
            return dict(zip(names, self._forward(feeds, "unbucketed")))
        first = feeds[self.inputs[0].name]
        n, seq = first.shape[:2]
        parts = []
        for sl in bk.batch_chunks(n, self.batch_buckets):
            chunk = {k: v[sl] for k, v in feeds.items()}
            rows = sl.stop - sl.start
            b, s = bk.bucket_for(rows, seq, self.batch_buckets, self.seq_buckets)
            out = self._forward(bk.pad(chunk, b, s, self.pad_id), f"b{b}xs{s}")[0]
            parts.append(out[:rows, :seq])
        return {names[0]: np.concatenate(parts, axis=0)}

    def run_unpadded(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The same model on the exact feed shapes (no bucket padding): the reference for buckets."""
        names = [o.name for o in self.outputs]
        return dict(zip(names, self._forward(feeds, f"exact{tuple(next(iter(feeds.values())).shape)}")))

    def _warm_up(self) -> None:
        """Run every (batch, seq) bucket once at load; record first-run and steady-run cost."""
        import numpy as np
        names = [s.name for s in self.inputs]
        for b in self.batch_buckets:
            for s in self.seq_buckets:
                feeds = {n: np.zeros((b, s), np.int64) for n in names}
                if "input_ids" in feeds:
                    feeds["input_ids"][:] = 101
                if "attention_mask" in feeds:
                    feeds["attention_mask"][:] = 1
                key = f"b{b}xs{s}"
                t = time.perf_counter()
                self._forward(feeds, key)
                first = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                self._forward(feeds, key)
                steady = (time.perf_counter() - t) * 1e3
                self.warmup_ms[key] = {"first_run_ms": first, "second_run_ms": steady}

    def op_times(self, feeds: dict[str, np.ndarray]) -> list[OpTime]:
        rows = dev.profile_ops(self.device, lambda: self.infer(feeds))
        kind = "npu" if dev.is_npu(self.device) else self.device.split(":")[0]
        return [OpTime(name=name, op_type=name.split("::")[-1], time_ms=ms, exec_type=kind) for name, ms,
                _ in rows if ms > 0]

    def profile_notes(self) -> dict[str, Any]:
        notes: dict[str, Any] = {
            "device": self.device,
            "dtype": self.dtype,
            "kind": self.kind,
            "compile": self.compiled,
            "compile_backend": self.compile_backend_name,
            "seq_buckets": list(self.seq_buckets),
            "batch_buckets": list(self.batch_buckets),
            "warmup_ms": self.warmup_ms,
            "compiles_per_bucket": dict(self.compiles),
        }
        if self.manifest.get("quant"):
            notes["quant"] = self.manifest["quant"]
        stats = dev.allocator_stats(self.device)
        if stats:
            notes["device_memory"] = stats
        return notes

    def release(self) -> None:
        self._fn = None
        self.module = None
        dev.empty_cache(self.device)
