"""A step decoder over llama.cpp's own batch API (llama-cpp-python's low-level bindings, ``llama_cpp.llama_cpp``).

One llama.cpp context holds every slot: slot ``s`` is llama.cpp sequence id ``s`` (``n_seq_max = slots``), each
with its own KV stream (``kv_unified = false``: llama.cpp gives each sequence ``n_ctx / n_seq_max`` cells,
padded up to a multiple of 256, llama.cpp ``src/llama-context.cpp``). ``decode(slots, ids)`` is one
``llama_decode`` of one token per slot; ``prefill`` sends a prompt in batches of ``n_batch`` tokens, logits
asked for the last token only, and ``prefill_batch`` several slots' prompts in one batch; ``reset`` removes
the sequence's cells (``llama_memory_seq_rm``).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import StepDecoder, pages, verbose
from edgeinfer.errors import BackendError, InputError, ModelError

N_BATCH = 512  # llama.cpp's default n_batch (llama_context_default_params), the prefill chunk
# kv_dtype -> (llama.cpp's type_k / type_v, bytes per element); q8_0 is 32 int8 values + one fp16 scale per block
KV_TYPES = {"fp16": ("GGML_TYPE_F16", 2.0), "fp32": ("GGML_TYPE_F32", 4.0), "q8_0": ("GGML_TYPE_Q8_0", 34 / 32)}
KV_ALIASES = {"f16": "fp16", "f32": "fp32", "int8": "q8_0"}
LLAMA_DEFAULT_THREADS = 4  # GGML_DEFAULT_N_THREADS, what llama_context_default_params gives


def default_threads(cpus: int | None = None) -> int:
    """Threads when none are asked for: llama.cpp's own default of 4, but one CPU fewer than this process may
    use. Its OpenMP threads spin at every barrier, so threads that fill the CPUs stall whenever anything else
    runs (serve's HTTP process, a client): SmolLM2-135M Q8_0 on the 2-CPU test machine decoded at 107-117 tok/s
    with 1 thread, 143-153 with 2 and 41-48 with 4 when idle; with one CPU kept busy, 112 / 40-62 / 35
    (plugins/llamacpp/README.md, "Threads")."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(LLAMA_DEFAULT_THREADS, cpus - 1))


def lib() -> Any:
    """llama-cpp-python's ctypes bindings (``llama_cpp.llama_cpp``) without running its package ``__init__``,
    which also imports the high-level ``Llama`` and with it jinja2 and diskcache (sqlite3), nothing here uses:
    the import 11.4 → 4.8 MiB, a served worker 403.8 → 399.6 (bench/README.md, "Footprint of the llamacpp
    backend"). A later ``import llama_cpp`` (``LlamaCppBackend.probe``) runs the package as usual over the same
    bindings. llama.cpp's log lines go through :func:`_log`, set again at every call: importing the package
    installs llama-cpp-python's own callback (``llama_cpp/_logger.py``), which numbers the levels the old way
    (WARN as ERROR, ERROR as DEBUG) and prints to stderr."""
    ll = sys.modules.get("llama_cpp.llama_cpp")
    if ll is None:
        ll = _bare_bindings()
    if not _callback:
        _callback.append(ll.llama_log_callback(_log))  # kept referenced: llama.cpp calls it for the process's life
    ll.llama_log_set(_callback[0], ctypes.c_void_p(0))
    return ll


def _bare_bindings() -> Any:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None:
        raise ModuleNotFoundError("No module named 'llama_cpp'", name="llama_cpp")
    bare = "llama_cpp" not in sys.modules
    if bare:  # the package without executing it: its __path__ only
        sys.modules["llama_cpp"] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module("llama_cpp.llama_cpp")
    finally:
        if bare:
            del sys.modules["llama_cpp"]


_callback: list[Any] = []
_last_level = [0]
ERROR, CONT = 4, 5  # ggml_log_level (ggml/include/ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_errors: list[str] = []  # llama.cpp's error lines since the last clear_errors()


def _log(level: int, text: bytes, _user: Any) -> None:
    """llama.cpp's log lines: on stderr only when the user asked for third-party output (--verbose); its error
    lines are kept for the one-line error the plugin raises when the call fails (:func:`llama_error`)."""
    if level != CONT:
        _last_level[0] = level
    line = text.decode("utf-8", errors="replace")
    if _last_level[0] == ERROR:
        if level == CONT and _errors:
            _errors[-1] += line
        elif len(_errors) < 8:  # the first lines of a failure say why; the rest are its callers
            _errors.append(line)
    if verbose():
        sys.stderr.write(line)
        sys.stderr.flush()


def clear_errors() -> None:
    _errors.clear()


def llama_error() -> str:
    """`` (llama.cpp: <its first error line since clear_errors()>)``, or '' when it logged none: a failed load
    logs the cause first ("tensor 'token_embd.weight' data is not within the file bounds, model is corrupted
    or incomplete") and then the callers' lines ("failed to load model")."""
    if not _errors:
        return ""
    first = re.sub(r"^(\w+: )+", "", " ".join(_errors[0].split()))
    return f" (llama.cpp: {first})"


_initialized: list[bool] = []


def init_backend() -> Any:
    ll = lib()
    if not _initialized:
        ll.llama_backend_init()
        _initialized.append(True)
    return ll


def amx_build(ll: Any) -> bool:
    """Whether this llama.cpp was built with its AMX int8 kernels (``GGML_NATIVE`` on a CPU with AMX, e.g. a
    Xeon Sapphire Rapids). In that build llama.cpp repacks Q8_0 / Q4_0 weights into AMX buffers by default, and
    ``ggml_backend_amx_mul_mat`` crashed the process (SIGSEGV in an OpenMP worker, llama-cpp-python 0.3.36, 2-core
    Xeon VM, December 2026; llama-server of the same source: SIGILL): weights then stay in plain CPU buffers
    (``use_extra_bufts = false``, what llama-server's ``--no-repack`` sets; this also turns off llama.cpp's
    non-AMX repacking)."""
    return b"AMX_INT8 = 1" in (ll.llama_print_system_info() or b"")


class Batch:
    """A ``llama_batch`` of up to ``size`` tokens, one sequence id each, freed with the decoder."""

    def __init__(self, ll: Any, size: int):
        self._ll, self.size = ll, size
        self.raw = ll.llama_batch_init(size, 0, 1)

    def fill(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int], logits: Sequence[bool]):
        b = self.raw
        b.n_tokens = len(tokens)
        for i, (t, p, s, want) in enumerate(zip(tokens, positions, seqs, logits)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = int(t), int(p), 1, int(want)
            b.seq_id[i][0] = int(s)
        return b

    def free(self) -> None:
        if self.raw is not None:
            self._ll.llama_batch_free(self.raw)
            self.raw = None


def meta(ll: Any, model: Any, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = ll.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else None


class LlamaCppDecoder(StepDecoder):
    def __init__(self, gguf: Path, context: int, slots: int, threads: int | None = None, kv_dtype: str = "fp16",
                 offload: bool = False):
        kv_dtype = KV_ALIASES.get(kv_dtype, kv_dtype)
        if kv_dtype not in KV_TYPES:
            raise InputError(f"kv_dtype must be one of {', '.join(KV_TYPES)}, got {kv_dtype!r}")
        ll = self._ll = init_backend()
        self._model = self._ctx = None
        self._batch: Batch | None = None
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = -1 if offload else 0  # offload: every layer on the NPU (a CANN build)
        mparams.use_extra_bufts = not amx_build(ll)
        # llama.cpp maps the GGUF and, where it has repacked kernels for a type (Q4_0 here: AVX2 / AVX-512),
        # copies those weights into buffers of its own: the pages it read are dropped as it goes, not left
        # resident beside the copy (a 210 M-parameter Q4_0 model's peak 324 -> 218 MiB, plugins/llamacpp/README.md)
        clear_errors()
        with pages.dropping(gguf):
            self._model = ll.llama_model_load_from_file(str(gguf).encode(), mparams)
        if not self._model:
            raise ModelError(f"llama.cpp cannot load {gguf.name}{llama_error()}: re-download or convert the model "
                             "again")
        limit = ll.llama_model_n_ctx_train(self._model)
        if context > limit:
            raise InputError(f"context {context} exceeds the model's context length ({limit}); use --ctx {limit}")
        self.n_batch = min(N_BATCH, context)
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = context * slots
        cparams.n_batch = cparams.n_ubatch = max(self.n_batch, slots)
        cparams.n_seq_max = slots
        cparams.kv_unified = False
        ggml_type, elem = KV_TYPES[kv_dtype]
        cparams.type_k = cparams.type_v = getattr(ll, ggml_type)
        self.threads = int(threads) if threads else default_threads()
        cparams.n_threads = cparams.n_threads_batch = self.threads
        clear_errors()
        self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise BackendError(f"llama.cpp could not create a context of {context} positions × {slots} slots for "
                               f"{gguf.name}{llama_error()}")
        self._mem = ll.llama_get_memory(self._ctx)
        self._batch = Batch(ll, cparams.n_batch)
        self.lengths = [0] * slots
        self.kv_dtype = kv_dtype
        vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self._model))
        super().__init__(context=context, vocab_size=int(vocab), kv_cache_bytes=self._kv_bytes(elem), slots=slots,
                         prefill_chunk=self.n_batch, device="NPU" if offload else "CPU")

    def _kv_bytes(self, elem: float) -> int:
        """K and V of every layer for the cells llama.cpp allocated (``llama_n_ctx``: all slots, padded)."""
        ll, m = self._ll, self._model
        arch = meta(ll, m, "general.architecture") or ""
        head = ll.llama_model_n_embd(m) // max(1, ll.llama_model_n_head(m))
        k = int(meta(ll, m, f"{arch}.attention.key_length") or head)
        v = int(meta(ll, m, f"{arch}.attention.value_length") or head)
        cells = ll.llama_n_ctx(self._ctx)
        return round(ll.llama_model_n_layer(m) * ll.llama_model_n_head_kv(m) * (k + v) * cells * elem)

    def _check_room(self, slot: int, n: int) -> None:
        if not 0 <= slot < self.slots:
            raise InputError(f"slot {slot} does not exist: this decoder has {self.slots} slot(s)")
        if self.lengths[slot] + n > self.context:
            raise InputError(f"slot {slot}: {self.lengths[slot] + n} positions exceed the context of {self.context}")

    def _decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int],
                logits: Sequence[bool]) -> None:
        clear_errors()
        rc = self._ll.llama_decode(self._ctx, self._batch.fill(tokens, positions, seqs, logits))
        if rc != 0:
            raise BackendError(f"llama_decode returned {rc} for {len(tokens)} token(s){llama_error()}")

    def _logits(self, i: int) -> np.ndarray:
        return self._rows([i])[0]

    def _rows(self, indices: Sequence[int]) -> np.ndarray:
        """The logits of the batch's tokens ``indices``, copied once into one array (no per-row temporaries: with
        a 151,936-token vocabulary at 16 slots each copy of a step's logits is 9.3 MiB)."""
        out = np.empty((len(indices), self.vocab_size), np.float32)
        for j, i in enumerate(indices):
            out[j] = np.ctypeslib.as_array(self._ll.llama_get_logits_ith(self._ctx, i), shape=(self.vocab_size,))
        return out

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        ids = [int(t) for t in np.asarray(token_ids).reshape(-1)]
        if not ids:
            raise InputError("prefill needs at least one token")
        self._check_room(slot, len(ids))
        for start in range(0, len(ids), self.n_batch):
            part = ids[start : start + self.n_batch]
            first = self.lengths[slot]
            last = start + len(part) == len(ids)
            self._decode(part, range(first, first + len(part)), [slot] * len(part),
                         [last and i == len(part) - 1 for i in range(len(part))])
            self.lengths[slot] += len(part)
        return self._logits(len(part) - 1)

    def prefill_batch(self, slots: Sequence[int], token_ids: Sequence[np.ndarray]) -> np.ndarray:
        """Several slots' prompt chunks as one ``llama_decode`` (one batch, a sequence id per token) when they fit
        one batch of ``n_batch`` tokens; else one ``prefill`` per slot."""
        slots = [int(s) for s in slots]
        rows = [[int(t) for t in np.asarray(ids).reshape(-1)] for ids in token_ids]
        if len(set(slots)) != len(slots) or not all(rows) or sum(map(len, rows)) > self.n_batch:
            return super().prefill_batch(slots, token_ids)
        for s, r in zip(slots, rows):
            self._check_room(s, len(r))
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[int] = []
        last: list[int] = []
        for s, r in zip(slots, rows):
            tokens += r
            positions += range(self.lengths[s], self.lengths[s] + len(r))
            seqs += [s] * len(r)
            last.append(len(tokens) - 1)
        wanted = set(last)
        self._decode(tokens, positions, seqs, [i in wanted for i in range(len(tokens))])
        for s, r in zip(slots, rows):
            self.lengths[s] += len(r)
        return self._rows(last)

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        """One ``llama_decode`` of one token per slot."""
        slots = [int(s) for s in slots]
        if len(set(slots)) != len(slots):
            raise InputError("decode takes each slot once per step")
        for s in slots:
            self._check_room(s, 1)
        ids = [int(t) for t in np.asarray(token_ids).reshape(-1)]
        self._decode(ids, [self.lengths[s] for s in slots], slots, [True] * len(slots))
        for s in slots:
            self.lengths[s] += 1
        return self._rows(range(len(slots)))

    def reset(self, slot: int) -> None:
        self._ll.llama_memory_seq_rm(self._mem, slot, -1, -1)
        self.lengths[slot] = 0

    def release(self) -> None:
        if self._batch is not None:
            self._batch.free()
        if self._ctx:
            self._ll.llama_free(self._ctx)
        if self._model:
            self._ll.llama_model_free(self._model)
        self._ctx = self._model = self._batch = None
