"""Decoder models on onnxruntime: step primitives over a KV cache preallocated on the host.

The ONNX decoder is built by onnxruntime-genai's model builder (``python -m onnxruntime_genai.models.builder``,
https://github.com/microsoft/onnxruntime-genai, ``src/python/py/models/builder.py``), which emits
``GroupQueryAttention`` with past and present KV sharing one buffer. Here each layer's K and V are one NumPy array
of ``[slots, kv_heads, context, head_size]``; a run binds the rows of a contiguous range of slots (a view, no copy)
as both ``past`` and ``present`` through IOBinding, so onnxruntime writes new rows in place: the cache is allocated
once at load and never copied or grown.

Batched decode: the graph takes ``attention_mask`` ``[batch, total]`` only through
``seqlens_k = ReduceSum(mask, 1) - 1`` and ``total_sequence_length = mask.shape[1]``, and GroupQueryAttention
(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md, ``com.microsoft.GroupQueryAttention``)
writes each row's new token at its own ``seqlens_k`` and takes its rotary position from it. So one run decodes slots
at different lengths: row ``r`` of the mask holds ``length[r] + 1`` ones (right-padded). Slots inside the range that
are not decoding (e.g. mid-prefill) ride along as dummy rows: their dummy key/value lands at their current length,
past every valid row, and is overwritten by their next real token.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import OpTime, StepDecoder, cache, pages
from edgeinfer.contract.helpers import inside
from edgeinfer.errors import InputError, ModelError

from . import custom_ops
from .blocks import CONVERSION_DEFAULTS, DEFAULT_BLOCK, INT8_BLOCK
from .builder import GENAI_CONFIG, builder_version, export, is_built
from .embedding import embedding_fp16, head_embedding, quantize_embedding
from .kv_cache import GRAPH_TYPES, check_q8, kv_name, kv_to_fp16, kv_to_q8, layout
from .last_logits import INPUT as LAST_INDEX
from .weights import data_path, quantize_int8, save

PRECISIONS = ("fp32", "int4")
PREFILL_CHUNK = 512  # prompt tokens a run: a run holds one buffer per tensor shape throughout (docs/generation.md)


# edgeinfer scheme -> the builder's precision; w4a16 / w4a8: its int4 MatMulNBits on fp32 activations (level 1) / on
# int8 per block (level 4, as llama.cpp's Q4_0 on a CPU); where the own ops build, its fp32 graph on MatMulW4 instead
SCHEMES = {"fp32": ("fp32", []), "w4a16": ("int4", ["int4_accuracy_level=1"]),
           "w4a8": ("int4", ["int4_accuracy_level=4"]), "w8a16": ("fp32", []), "w8a8": ("fp32", []),
           "fp16": ("fp32", [])}


def convert(hf_dir: Path, scheme: str, context: int, out: Path, group_size: int | None,
            kv_dtype: str = "fp16") -> dict[str, Any]:
    """The deploy artifact: the builder's output for ``scheme``, its context limit set to ``context``, its KV
    cache in ``kv_dtype`` (:mod:`.kv_cache`)."""
    kv_dtype = kv_name(kv_dtype)
    family = scheme.split("_g")[0]
    own = custom_ops.not_for_deploy() is None  # edgeinfer's own ops build here, and an AVX build (custom_ops.py)
    kernel = family in custom_ops.OPS and own  # fp16, w8a16, w4a16, w4a8 on the own matmuls; else onnxruntime's
    precision, extra = ("fp32", []) if kernel else SCHEMES[family]  # the int4 classes: Q4_1 blocks of their own
    planes = family == "fp16" and not kernel  # two int8 planes a weight (weight_planes.py)
    # attention over the fp16 KV cache on the own op too (kernels/attention.c), fp32 included: where the library
    # cannot be built a graph whose only own op is the attention loads with onnxruntime's (custom_ops.session_graph)
    attention = own
    if kv_dtype == "q8_0":
        check_q8(hf_dir, custom_ops.not_for_deploy())
    int8 = (family in ("w8a16", "w8a8") and not kernel) or planes  # onnxruntime's MatMulNBits
    block = group_size or (INT8_BLOCK if family.startswith("w8") or planes else DEFAULT_BLOCK)
    if precision == "int4":
        extra = [*extra, f"int4_block_size={block}"]
    export(hf_dir, out, precision, extra)
    cfg_path = out / GENAI_CONFIG
    cfg = json.loads(cfg_path.read_text())
    graph = inside(out, cfg["model"]["decoder"]["filename"], f"{GENAI_CONFIG} model.decoder.filename")
    if int8:
        quantize_int8(graph, block, activations_int8=scheme.startswith("w8a8"), low_planes=planes)
    quantized = int8 or precision == "int4" or family == "w8a16"  # an int8 embedding too
    kv16 = kv_dtype != "fp32"  # q8_0: the fp16 graph's own attention on a q8_0 cache
    embedding, own_attention = None, False
    if quantized or kv16 or kernel:
        import onnx

        model = onnx.load(str(graph))
        ids = cfg["model"]["decoder"]["inputs"]["input_ids"]
        if kernel:
            custom_ops.use_kernels(model, family, block, INT8_BLOCK)
        if quantized or kernel:  # a tied head on the own matmuls serves the lookup too; else a table of its own
            embedding = (kernel and head_embedding(model, ids)) or (
                embedding_fp16(model, ids) if family == "fp16" else quantize_embedding(model, ids, INT8_BLOCK))
        if kv16:
            kv_to_fp16(model)
            head = int(cfg["model"]["decoder"]["head_size"])
            own_attention = attention and custom_ops.use_attention(model, head) > 0
            if kv_dtype == "q8_0":
                kv_to_q8(model, head)
        save(model, graph)
    limit = int(cfg["model"]["context_length"])
    if context > limit:
        raise InputError(f"context {context} exceeds the model's context length ({limit}); use --ctx {limit}")
    cfg["model"]["context_length"] = context  # open_decoder refuses a larger context than the one deployed
    cfg["search"]["max_length"] = context
    cfg_path.write_text(json.dumps(cfg, indent=4) + "\n")
    needs_library = custom_ops.own_ops(graph) - {"GroupQueryAttention"}  # a lone attention op falls back
    facts: dict[str, Any] = {"target": custom_ops.TARGET if needs_library else "cpu",
                             "builder": f"onnxruntime-genai {builder_version()}",
                             "precision": precision, "kv_dtype": kv_dtype}
    if int4 := family in custom_ops.DIGITS:
        facts["int4_block_size"] = block
    if kernel:
        op = f"{custom_ops.DOMAIN}.{custom_ops.OPS[family]}"
        acts = "int8 activations per block" if family == "w4a8" else "fp32 activations"
        q41 = (f"{' (halved, to 32, on rows it does not divide)' * (block > 32)}, a scale and a minimum each",
               f", the LM head int8 in blocks of {INT8_BLOCK}") if int4 else ("", "")
        facts["then"] = (f"fp16 weights, each MatMul an {op} (custom_ops.py)" if family == "fp16" else
                         f"int{family[1]} weights in blocks of {block}{q41[0]}, each MatMul an {op} on {acts}"
                         f"{q41[1]} (custom_ops.py)")
        if family == "w8a16":
            facts["int8_block_size"] = block
    if own_attention:
        facts["attention"] = (f"{custom_ops.DOMAIN}.GroupQueryAttention{'Q8' * (kv_dtype == 'q8_0')} over the "
                              f"{kv_dtype} KV cache (custom_ops.py)")
    if int8:  # "precision": the builder's, before the steps below
        facts.update(int8_block_size=block, then="onnxruntime MatMulNBitsQuantizer bits=8" + (
            ", each weight's residual a second int8 plane (weight_planes.py)" if planes else "") + (
            "" if scheme.startswith("w8a8") else ", each node on the int8 kernel over its input's two int8 digits"
                                                 " (int8_digits.py)"))
    return {**facts, **(embedding or {})}


def build(hf_dir: Path, cache_root: Path, precision: str, kv_dtype: str = "fp32") -> Path:
    """The builder's output for ``hf_dir`` in the cache, building it on first use, its KV cache in
    ``kv_dtype``."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    from edgeinfer.contract.stamp import sha256_file

    kv = "" if kv_dtype == "fp32" else f"|kv {kv_dtype}"
    # this plugin's code too: its export and KV rewrite make the artifact (cache.code: an edited source tree)
    what = (f"{sha256_file(hf_dir)}|{precision}|{builder_version()}{kv}|{CONVERSION_DEFAULTS['lm_head']}|"
            f"{cache.code(sys.modules[__name__])}")
    key = hashlib.sha256(what.encode()).hexdigest()[:24]
    out = cache_root / "onnxruntime-decoders" / key
    with cache.locked(out):  # a concurrent build of the same model (another test worker) waits for this one's
        return out if is_built(out) else _build(hf_dir, out, precision, kv_dtype)


def _build(hf_dir: Path, out: Path, precision: str, kv_dtype: str) -> Path:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        export(hf_dir, tmp, precision)
        if kv_dtype == "fp16":
            import onnx

            graph = tmp / json.loads((tmp / GENAI_CONFIG).read_text())["model"]["decoder"]["filename"]
            save(kv_to_fp16(onnx.load(str(graph))), graph)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def check_graph(sess: Any, where: Path, cfg: dict[str, Any]) -> str:
    """The config's facts against the graph it names: the KV inputs of each layer, their heads and head size,
    the logits width and the dtypes the step loop binds (int64 ids, float32 logits, one type for every KV input:
    float32, float16, or q8_0's uint8 rows). A config that disagrees would fail at the first step, or run and
    generate garbage. The KV cache's dtype (kv_cache.GRAPH_TYPES)."""
    dec = cfg["decoder"]
    names_in, names_out = dec["inputs"], dec["outputs"]
    inputs = {t.name: t for t in sess.get_inputs()}
    outputs = {t.name: t for t in sess.get_outputs()}
    layers, kv_heads, head = dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"]
    past = {names_in[k] % i for k in ("past_key_names", "past_value_names") for i in range(layers)}

    def wrong(fact: str) -> ModelError:
        return ModelError(f"{where} does not describe its graph: {fact}; convert the model again")

    if set(inputs) - {names_in["input_ids"], names_in["attention_mask"], LAST_INDEX} != past:
        raise wrong(f"num_hidden_layers is {layers}, but the graph's KV inputs are not those of {layers} layers")
    ids, logits = inputs.get(names_in["input_ids"]), outputs.get(names_out["logits"])
    if ids is None or ids.type != "tensor(int64)" or logits is None or logits.type != "tensor(float)":
        raise wrong("the graph takes no int64 input ids or gives no float32 logits under the names it gives")
    if isinstance(logits.shape[-1], int) and logits.shape[-1] != cfg["vocab_size"]:
        raise wrong(f"vocab_size is {cfg['vocab_size']}, but the graph gives {logits.shape[-1]} logits per token")
    kv_type = inputs[min(past)].type if past else "tensor(float)"
    width = layout(GRAPH_TYPES[kv_type], head)[1] if kv_type in GRAPH_TYPES else head
    for name in sorted(past):
        t = inputs[name]
        dims = (t.shape[1], t.shape[3]) if len(t.shape) == 4 else (None, None)
        if t.type != kv_type or kv_type not in GRAPH_TYPES or (all(isinstance(d, int) for d in dims)
                                                                and dims != (kv_heads, width)):
            raise wrong(f"num_key_value_heads {kv_heads} × head_size {head} (float32, float16 or q8_0, alike in "
                        f"every layer), but the graph's {name} is {t.type} {t.shape}")
    return GRAPH_TYPES[kv_type]


def prefill_runs(slots: Sequence[int], sizes: Sequence[int], lengths: Sequence[int],
                 context: int) -> list[list[int]]:
    """Indexes into ``slots`` grouped into one-run batches. GroupQueryAttention takes several rows of more
    than one token only as a first prompt ("batch_size must be 1 when sequence_length > 1 and past context
    is given", onnxruntime 1.26): so a run holds empty slots only (``lengths`` 0; a slot that holds a chunk
    already runs alone), consecutive ones (a run binds a contiguous range of the cache), with room for the
    run's padded width, and at most ``max(16, real // 2)`` padding tokens: a padded token costs compute like
    a real one, and past that a second run (one more pass over the weights) is the cheaper choice."""
    runs: list[list[int]] = []
    for i in sorted(range(len(slots)), key=lambda i: slots[i]):
        run = runs[-1] if runs else None
        if run is not None and slots[i] == slots[run[-1]] + 1 and lengths[slots[i]] == lengths[slots[run[0]]] == 0:
            width = max(sizes[i], *(sizes[j] for j in run))
            real = sizes[i] + sum(sizes[j] for j in run)
            if width <= context and (len(run) + 1) * width - real <= max(16, real // 2):
                run.append(i)
                continue
        runs.append([i])
    return runs


class OnnxRuntimeDecoder(StepDecoder):
    def __init__(self, model_dir: Path, context: int, slots: int, threads: int | None = None,
                 spin_wait: bool | None = None):
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
        self._ort, self._threads, self._spin_wait = ort, threads, spin_wait
        self.threads = int(threads) if threads else None  # else onnxruntime's own: one per physical core
        # onnxruntime refuses external data that leads out of the graph's directory itself ("External data path
        # ... escapes model directory", 1.26; plugins/onnxruntime/tests keep that true); the graph file is ours
        graph = inside(model_dir, dec["filename"], f"{GENAI_CONFIG} model.decoder.filename")
        # what each session loads (a path, or a serialized graph; custom_ops.py) and registers, found once
        self._onnx, self._library, caveat, in_place = custom_ops.session_graph(graph)
        self._folder = str(graph.parent)
        if in_place:  # the own matmuls read the weights from onnxruntime's mapping of the file: large folios
            pages.read_whole(data_path(graph))
        self._sess = ort.InferenceSession(self._onnx, self._options(), providers=["CPUExecutionProvider"])
        pages.collapse_resident()  # the weights onnxruntime packed at load, read once a token: on 2 MiB pages
        self.kv_dtype = check_graph(self._sess, model_dir / GENAI_CONFIG, cfg)  # the plan's and the manifest's name
        # graphs converted before the LM head ran at one position per row give every position's logits
        self._last = LAST_INDEX in {i.name for i in self._sess.get_inputs()}
        self._names = {
            "ids": names_in["input_ids"], "mask": names_in["attention_mask"], "logits": names_out["logits"],
            "past": [(names_in["past_key_names"] % i, names_in["past_value_names"] % i) for i in range(layers)],
            "present": [(names_out["present_key_names"] % i, names_out["present_value_names"] % i)
                        for i in range(layers)],
        }
        kv_type, width = layout(self.kv_dtype, head)
        shape = (slots, kv_heads, context, width)
        self._cache = [(np.zeros(shape, kv_type), np.zeros(shape, kv_type)) for _ in range(layers)]
        self._bound: dict[tuple[int, int], list[tuple[Any, Any]]] = {}  # (first, end) slot range -> OrtValues
        self._bindings: dict[tuple[int, int], Any] = {}  # (first, end) slot range -> IOBinding over them
        self.lengths = [0] * slots
        kv_bytes = sum(a.nbytes for kv in self._cache for a in kv)
        super().__init__(context=context, vocab_size=int(cfg["vocab_size"]), kv_cache_bytes=kv_bytes, slots=slots,
                         prefill_chunk=PREFILL_CHUNK, device="CPU")
        self.caveat = caveat

    def _options(self, profile_prefix: str | None = None) -> Any:
        opts = self._ort.SessionOptions()
        # No CPU memory arena (https://onnxruntime.ai/docs/api/python/api_summary.html#onnxruntime.SessionOptions.
        # enable_cpu_mem_arena): a decoder's shapes change every step, and the arena kept growing with them —
        # a served w8a16 worker (MatMulNBits on fp32 activations) grew to 579 MiB over one round of the peer
        # bench's workloads and 717 over two, 395 without it; fp32 and w8a8 +2-7 MiB without it and faster at
        # 16 streams (fp32 197 → 216, w8a8 340 → 409 tok/s). bench/serve_processes.py --peer-rounds, docs/planner.md
        opts.enable_cpu_mem_arena = False
        if self._library:
            opts.register_custom_ops_library(self._library)
        if isinstance(self._onnx, bytes):
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", self._folder)
        if self._threads:
            opts.intra_op_num_threads = int(self._threads)
        if self._spin_wait is not None:  # idle intra-op threads busy-wait by default (onnxruntime's threadpool)
            opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if self._spin_wait else "0")
        if profile_prefix:
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_prefix
        return opts

    def _views(self, first: int, end: int) -> list[tuple[Any, Any]]:
        """Per layer, (K, V) OrtValues over the cache rows of slots ``first..end-1`` (views: writes land in
        the cache)."""
        key = (first, end)
        if key not in self._bound:
            self._bound[key] = [tuple(self._ort.OrtValue.ortvalue_from_numpy(a[first:end]) for a in kv)
                                for kv in self._cache]
        return self._bound[key]

    def _step(self, first: int, ids: np.ndarray, starts: Sequence[int], sess: Any = None,
              last: Sequence[int] | None = None) -> np.ndarray:
        """One run over slots ``first..first+len(starts)-1``: ``ids`` ``[rows, n]`` written from each row's
        ``starts`` position (all ``n`` of them: each row needs ``n`` free positions); per row, the logits at
        its position ``last[r]`` of the ``n`` (default: the last)."""
        n = ids.shape[1]
        width = max(starts) + n
        mask = (np.arange(width)[None] < np.asarray(starts)[:, None] + n).astype(np.int64)  # right-padded
        b = self._binding(first, first + len(starts), sess)
        b.bind_cpu_input(self._names["ids"], np.ascontiguousarray(ids, dtype=np.int64))
        b.bind_cpu_input(self._names["mask"], mask)
        at = np.full(len(starts), n - 1, np.int64) if last is None else np.asarray(last, np.int64)
        if self._last:
            b.bind_cpu_input(LAST_INDEX, at.reshape(-1, 1, 1))
        # logits into an array of ours: only they are read back (reading every output back would copy each
        # bound KV range too, the cost that grew the batched step with its rows)
        logits = np.empty((len(starts), 1 if self._last else n, self.vocab_size), np.float32)
        b.bind_output(self._names["logits"], "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        (sess or self._sess).run_with_iobinding(b)
        return logits[:, 0] if self._last else logits[np.arange(len(starts)), at]

    def _binding(self, first: int, end: int, sess: Any = None) -> Any:
        """An IOBinding with every layer's K and V of slots ``first..end-1`` bound as past and present, kept per
        range for this decoder's session: a step binds only its ids, mask and logits (a 16-layer step bound 64 KV
        values again each time)."""
        key = (first, end)
        b = None if sess is not None else self._bindings.get(key)
        if b is None:
            b = (sess or self._sess).io_binding()
            for (pk, pv), (ok, ov), (k, v) in zip(self._names["past"], self._names["present"],
                                                  self._views(first, end)):
                b.bind_ortvalue_input(pk, k)
                b.bind_ortvalue_input(pv, v)
                b.bind_ortvalue_output(ok, k)  # present shares the past buffer: written in place
                b.bind_ortvalue_output(ov, v)
            if sess is None:
                self._bindings[key] = b
        return b

    def _check_room(self, slot: int, n: int) -> None:
        if self.lengths[slot] + n > self.context:
            raise InputError(f"slot {slot}: {self.lengths[slot] + n} positions exceed the context of {self.context}")

    def _run(self, slot: int, ids: np.ndarray, sess: Any = None) -> np.ndarray:
        self._check_room(slot, int(ids.shape[0]))
        logits = self._step(slot, np.asarray(ids, dtype=np.int64)[None], [self.lengths[slot]], sess)
        self.lengths[slot] += int(ids.shape[0])
        return logits[0]

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        return self._run(slot, token_ids)

    def prefill_batch(self, slots: Sequence[int], token_ids: Sequence[np.ndarray]) -> np.ndarray:
        """New prompts in as few runs as :func:`prefill_runs` allows: a run over a range of consecutive empty
        slots, the chunks right-padded to the longest; the padding lands past each row's length, masked out
        of attention (causal) and overwritten by the row's next tokens."""
        ids = [np.asarray(t, dtype=np.int64).reshape(-1) for t in token_ids]
        if len(set(slots)) != len(slots):
            raise InputError(f"prefill_batch takes each slot once, got {list(slots)}")
        for s, t in zip(slots, ids):
            self._check_room(s, len(t))
        out = np.empty((len(slots), self.vocab_size), np.float32)
        for run in prefill_runs(slots, [len(t) for t in ids], self.lengths, self.context):
            if len(run) == 1:
                out[run[0]] = self._run(slots[run[0]], ids[run[0]])
                continue
            width = max(len(ids[i]) for i in run)
            batch = np.zeros((len(run), width), np.int64)
            for r, i in enumerate(run):
                batch[r, : len(ids[i])] = ids[i]
            first = slots[run[0]]
            out[run] = self._step(first, batch, self.lengths[first : first + len(run)],
                                  last=[len(ids[i]) - 1 for i in run])
            for i in run:
                self.lengths[slots[i]] += len(ids[i])
        return out

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        """One run over the range of slots from the lowest to the highest in ``slots``."""
        for s in slots:
            self._check_room(s, 1)
        first, end = min(slots), max(slots) + 1
        rows = np.asarray(slots) - first
        idle = set(range(first, end)) - set(slots)
        if any(self.lengths[s] >= self.context for s in idle) or len(set(slots)) != len(slots):
            # a full idle slot has no free row for a dummy token: decode one slot at a time (rare)
            return np.stack([self._run(s, token_ids[i : i + 1]) for i, s in enumerate(slots)])
        ids = np.zeros((end - first, 1), np.int64)
        ids[rows, 0] = token_ids
        logits = self._step(first, ids, self.lengths[first:end])
        for s in slots:
            self.lengths[s] += 1
        return logits[rows]

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
        self._bound, self._bindings = {}, {}
        self._cache = []


def open_decoder(model: Path, context: int, slots: int, cache_root: Path, options: dict[str, Any]) -> StepDecoder:
    """``kv_dtype``: the KV cache a Hugging Face directory is exported with (default fp32: the lossless path
    the conformance kit checks token for token); a built artifact (a bundle's) keeps the one it was built
    with, and refuses another."""
    precision = options.pop("precision", "fp32")
    threads = options.pop("threads", None)
    spin_wait = options.pop("spin_wait", None)
    if spin_wait is not None and not isinstance(spin_wait, bool):
        raise InputError(f"option spin_wait must be true or false, got {spin_wait!r}")
    kv_dtype = options.pop("kv_dtype", None)
    kv_dtype = kv_name(kv_dtype) if kv_dtype is not None else None
    if not model.is_dir():
        raise ModelError(f"{model} is not a model directory (a Hugging Face decoder or onnxruntime-genai output)")
    if kv_dtype == "q8_0" and not is_built(model):
        raise InputError("a q8_0 KV cache is built by deploy", f"edgeinfer deploy {model} --option kv_dtype=q8_0")
    built = model if is_built(model) else build(model, cache_root, precision, kv_dtype or "fp32")
    decoder = OnnxRuntimeDecoder(built, context, slots, threads, spin_wait)
    if kv_dtype and decoder.kv_dtype != kv_dtype:
        decoder.close()
        raise InputError(f"{model} keeps its KV cache in {decoder.kv_dtype}, not {kv_dtype}: it was built so; "
                         f"omit kv_dtype, or deploy again with --option kv_dtype={kv_dtype}")
    return decoder
