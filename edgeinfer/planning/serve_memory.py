"""What ``edgeinfer serve`` adds to a decoder's plan: the processes around the decoder worker. The plan's
breakdown (weights + KV + activations + runtime) is one decoder process, the worker; a served decoder also has
serve's HTTP process. Its peak RSS depends on the model through its tokenizer only: one measured figure
(``edgeinfer/data/serve_memory.json``, from ``bench/serve_footprint.py``'s JSON) plus the tokenizer's
(``tokenizer_kept``, per vocabulary entry beyond the test tokenizer the figure was measured with: the HTTP
process holds it, the workers get token ids). A decoder worker is started without multiprocessing
(``serve/child.py``); encoder workers and request helpers are started with its spawn method, which starts
multiprocessing's resource tracker first (CPython's ``popen_spawn_posix`` hands each child its fd), and with
encoders the HTTP process imports numpy to batch their arrays: ``parts_mib.with_encoders``. Request helpers
(``serve.prep.Offload``) are not in it: they start only when a body above 64 KiB needs one
(``--request-helpers``; a chat template renders on a thread of the HTTP process), ~70 MiB each with the
test tokenizer (``parts_mib.request_helper_each``), and each holds the tokenizers too. A served decoder with
``--slots S`` is the plan at ``--batch S``, less what a served decoder worker holds less than the decoder process the
runtime overheads were measured in (``parts_mib.served_worker_saving``: the worker loads from what the HTTP process
read of the bundle's manifest, without its schema). With ``serve --in-process`` the decoder runs on a thread of the
HTTP process: one interpreter less, ``parts_mib.in_process_saving`` (measured, the smaller of two models'
savings)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).parents[1] / "data" / "serve_memory.json"
MIB = 2**20


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    return json.loads(DATA.read_text(encoding="utf-8"))


def serve_processes() -> dict[str, Any]:
    """``{"value": MiB, "source": ..., "parts_mib": {...}}``: serve's own processes, measured."""
    return _data()["serve_processes_mib"]


def tokenizer_bytes(vocab: int) -> int:
    """What a decoder's tokenizer of ``vocab`` tokens keeps resident in the HTTP process beyond the test
    tokenizer ``serve_processes_mib`` was measured with (``tokenizer_kept``: bench/tokenizer_memory.py)."""
    t = _data()["tokenizer_kept"]
    return int(max(0, vocab - t["base_vocab"]) * t["per_token_bytes"])


def serve_own_bytes(encoders: int) -> int:
    """Serve's own processes with ``encoders`` encoder, reranker or classifier bundles: the HTTP process (with
    each encoder's tokenizer), and with any encoder the resource tracker and numpy (``with_encoders``)."""
    own = serve_processes()
    parts = own["parts_mib"]
    extra = parts["with_encoders"] + encoders * parts["tokenizer_each"] if encoders else 0.0
    return int((own["value"] + extra) * MIB)


def in_process_saving_bytes() -> int:
    """What ``serve --in-process`` saves per decoder: its worker process's interpreter (measured)."""
    return int(serve_processes()["parts_mib"]["in_process_saving"] * MIB)


def served_worker_saving_bytes(prof: dict[str, Any] | None = None) -> int:
    """What a served decoder worker holds less than the decoder process its runtime's overhead was measured in:
    the runtime profile's (``prof``) ``served_worker_saving_mib`` where this project measured it against its own
    host rows' processes (onnxruntime), else no manifest schema (pydantic) in the worker (measured)."""
    own = (prof or {}).get("served_worker_saving_mib") or {}
    return int(own.get("value", serve_processes()["parts_mib"]["served_worker_saving"]) * MIB)


def served(breakdown: dict[str, int], vocab: int = 0, prof: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan's memory for the decoder served by ``edgeinfer serve`` on the runtime of profile ``prof``: the
    breakdown without the board's OS reserve (the measured peak does not hold it), less what a served worker
    holds less (:func:`served_worker_saving_bytes`), plus serve's own processes, whose HTTP process holds the
    decoder's tokenizer (of ``vocab`` tokens)."""
    own = serve_processes()
    tokenizer = tokenizer_bytes(vocab)
    extra = int(own["value"] * MIB) + tokenizer
    worker_saving = served_worker_saving_bytes(prof)
    decoder = sum(v for k, v in breakdown.items() if k != "reserved") - worker_saving
    saving = in_process_saving_bytes()
    return {"total_bytes": decoder + extra, "decoder_process_bytes": decoder, "serve_processes_bytes": extra,
            "tokenizer_bytes": tokenizer, "worker_saving_bytes": worker_saving,
            "in_process_total_bytes": max(decoder, decoder + extra - saving),
            "source": own["source"] + "; the tokenizer: " + _data()["tokenizer_kept"]["source"]}
