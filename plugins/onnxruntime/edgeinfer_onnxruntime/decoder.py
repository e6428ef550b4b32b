"""Decoder models on onnxruntime: step primitives over a KV cache preallocated on the host.

The ONNX decoder is built by onnxruntime-genai's model builder
(``python -m onnxruntime_genai.models.builder``, https://github.com/microsoft/onnxruntime-genai,
``src/python/py/models/builder.py``), which emits ``GroupQueryAttention`` with past and
present KV sharing one buffer. Here each layer's K and V are NumPy arrays of
``[1, kv_heads, context, head_size]`` per slot, bound as both ``past`` and ``present``
through IOBinding, so onnxruntime writes new rows in place: the cache is allocated
once at load and never copied or grown.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import Decoder, OpTime
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError

GENAI_CONFIG = "genai_config.json"
PRECISIONS = ("fp32", "int4")


def is_built(path: Path) -> bool:
    return (path / GENAI_CONFIG).is_file()


# edgeinfer scheme -> the builder's precision; w4a16 runs MatMulNBits with fp32 activations
# (int4_accuracy_level=1: accuracy level 4, the CPU default, would quantize activations to int8)
SCHEMES = {"fp32": ("fp32", []), "w4a16": ("int4", ["int4_accuracy_level=1"])}
DEFAULT_BLOCK = 32  # the builder's default int4_block_size


def builder_version() -> str:
    try:
        from importlib.metadata import version

        return version("onnxruntime-genai")
    except Exception:
        raise BackendUnavailableError(
            "onnxruntime-genai (its model builder) is not installed, so decoders cannot be exported to ONNX",
            "pip install onnxruntime-genai==0.14.1 onnx_ir (0.14.1 is the release that keeps protobuf 4.25)",
        ) from None


def export(hf_dir: Path, out: Path, precision: str, extra: Sequence[str] = ()) -> None:
    """Run the model builder on ``hf_dir`` into the (empty) directory ``out``."""
    builder_version()
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out),
           "-p", precision, "-e", "cpu", "-c", str(out / "hf-cache")]
    if extra:
        cmd += ["--extra_options", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    shutil.rmtree(out / "hf-cache", ignore_errors=True)
    if proc.returncode != 0 or not is_built(out):
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        raise ModelError(f"onnxruntime-genai could not export {hf_dir.name}: {lines[-1] if lines else 'no output'}")


def convert(hf_dir: Path, scheme: str, context: int, out: Path, group_size: int | None) -> dict[str, Any]:
    """The deploy artifact: the builder's output for ``scheme``, its context limit set to ``context``."""
    precision, extra = SCHEMES[scheme.split("_g")[0]]
    block = group_size or DEFAULT_BLOCK
    if precision == "int4":
        extra = [*extra, f"int4_block_size={block}"]
    export(hf_dir, out, precision, extra)
    cfg_path = out / GENAI_CONFIG
    cfg = json.loads(cfg_path.read_text())
    limit = int(cfg["model"]["context_length"])
    if context > limit:
        raise InputError(f"context {context} exceeds the model's context length ({limit}); use --ctx {limit}")
    cfg["model"]["context_length"] = context  # open_decoder refuses a larger context than the one deployed
    cfg["search"]["max_length"] = context
    cfg_path.write_text(json.dumps(cfg, indent=4) + "\n")
    facts: dict[str, Any] = {"target": "cpu", "builder": f"onnxruntime-genai {builder_version()}",
                             "precision": precision}
    if precision == "int4":
        facts["int4_block_size"] = block
    return facts


def build(hf_dir: Path, cache_root: Path, precision: str) -> Path:
    """The builder's output for ``hf_dir`` in the cache, building it on first use."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    from edgeinfer.contract.stamp import sha256_file

    key = hashlib.sha256(f"{sha256_file(hf_dir)}|{precision}|{builder_version()}".encode()).hexdigest()[:24]
    out = cache_root / "onnxruntime-decoders" / key
    if is_built(out):
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        export(hf_dir, tmp, precision)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class OnnxRuntimeDecoder(Decoder):
    def __init__(self, model_dir: Path, context: int, slots: int, threads: int | None = None):
        import onnxruntime as ort

        try:
            cfg = json.loads((model_dir / GENAI_CONFIG).read_text())["model"]
            dec = cfg["decoder"]
            layers, kv_heads, head = dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"]
            names_in, names_out = dec["inputs"], dec["outputs"]
            limit = int(cfg["context_length"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelError(f"{model_dir / GENAI_CONFIG} is not an onnxruntime-genai config: {e}") from None
        if context > limit:
            raise InputError(f"context {context} exceeds the model's context length ({limit}); use --ctx {limit}")
        self._ort, self._threads = ort, threads
        self._onnx = str(model_dir / dec["filename"])
        self._sess = ort.InferenceSession(self._onnx, self._options(), providers=["CPUExecutionProvider"])
        self._names = {
            "ids": names_in["input_ids"], "mask": names_in["attention_mask"], "logits": names_out["logits"],
            "past": [(names_in["past_key_names"] % i, names_in["past_value_names"] % i) for i in range(layers)],
            "present": [(names_out["present_key_names"] % i, names_out["present_value_names"] % i)
                        for i in range(layers)],
        }
        shape = (1, kv_heads, context, head)
        self._cache = [[(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(layers)]
                       for _ in range(slots)]
        self._bound = [[tuple(ort.OrtValue.ortvalue_from_numpy(a) for a in kv) for kv in slot]
                       for slot in self._cache]
        self.lengths = [0] * slots
        kv_bytes = sum(a.nbytes for slot in self._cache for kv in slot for a in kv)
        super().__init__(context=context, vocab_size=int(cfg["vocab_size"]), kv_cache_bytes=kv_bytes, slots=slots,
                         device="CPU")

    def _options(self, profile_prefix: str | None = None) -> Any:
        opts = self._ort.SessionOptions()
        if self._threads:
            opts.intra_op_num_threads = int(self._threads)
        if profile_prefix:
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_prefix
        return opts

    def _run(self, slot: int, ids: np.ndarray, sess: Any = None) -> np.ndarray:
        n, start = int(ids.shape[0]), self.lengths[slot]
        if start + n > self.context:
            raise InputError(f"slot {slot}: {start + n} positions exceed the context of {self.context}")
        sess = sess or self._sess
        b = sess.io_binding()
        b.bind_cpu_input(self._names["ids"], np.ascontiguousarray(ids, dtype=np.int64)[None])
        b.bind_cpu_input(self._names["mask"], np.ones((1, start + n), np.int64))
        for (pk, pv), (ok, ov), (k, v) in zip(self._names["past"], self._names["present"], self._bound[slot]):
            b.bind_ortvalue_input(pk, k)
            b.bind_ortvalue_input(pv, v)
            b.bind_ortvalue_output(ok, k)  # present shares the past buffer: written in place
            b.bind_ortvalue_output(ov, v)
        b.bind_output(self._names["logits"])
        sess.run_with_iobinding(b)
        self.lengths[slot] = start + n
        return b.copy_outputs_to_cpu()[-1][0, -1]

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        return self._run(slot, token_ids)

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        return np.stack([self._run(s, token_ids[i : i + 1]) for i, s in enumerate(slots)])

    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0  # stale rows past the length are masked out, then overwritten

    def op_times(self, phase: str, token_ids: np.ndarray) -> list[OpTime]:
        """Per-node times of one ``phase`` call from onnxruntime's own profiler: a profiling session
        over the same model and the same KV buffers runs the call twice (a warm-up, then the one
        kept; while it lives the weights are loaded twice). Decode profiles the last id after a
        prefill of the others."""
        from .backend import node_times

        ids = np.ascontiguousarray(token_ids, dtype=np.int64)
        self.reset(0)
        if phase == "decode" and len(ids) > 1:
            self._run(0, ids[:-1])
            ids = ids[-1:]
        start = self.lengths[0]
        with tempfile.TemporaryDirectory(prefix="edgeinfer-ort-prof-") as tmp:
            sess = self._ort.InferenceSession(self._onnx, self._options(os.path.join(tmp, "ort")),
                                              providers=["CPUExecutionProvider"])
            for _ in range(2):  # the same positions twice: the second run rewrites the rows the first wrote
                self.lengths[0] = start
                self._run(0, ids, sess)
            events = json.loads(Path(sess.end_profiling()).read_text())
        self.reset(0)
        return node_times(events)

    def release(self) -> None:
        self._sess = None
        self._bound = []
        self._cache = []


def open_decoder(model: Path, context: int, slots: int, cache_root: Path, options: dict[str, Any]) -> Decoder:
    precision = options.pop("precision", "fp32")
    threads = options.pop("threads", None)
    if not model.is_dir():
        raise ModelError(f"{model} is not a model directory (a Hugging Face decoder or onnxruntime-genai output)")
    built = model if is_built(model) else build(model, cache_root, precision)
    return OnnxRuntimeDecoder(built, context, slots, threads)
