"""Options of ``edgeinfer serve`` as one value object (shared by the CLI, the app and the tests)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from edgeinfer.errors import InputError, check_text
from edgeinfer.planning.chain import SERVE_MAX_BATCH, SERVE_SLOTS

API_KEY_ENV = "EDGEINFER_API_KEY"
KEY_REFUSAL = "missing or wrong API key: send 'Authorization: Bearer KEY'"
OPEN_PATHS = ("/health",)  # answered without the key (liveness probes); everything else, /metrics too, needs it


@dataclass
class ServeConfig:
    bundles: list[Path]
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = SERVE_MAX_BATCH  # (the default a chain plan counts an encoder at)
    batch_window_ms: float = 10.0
    devices: list[str] = field(default_factory=list)  # one worker per entry; [] → one worker, default device
    api_key: str | None = None
    max_queue: int = 1024  # queued (not yet running) requests, all models together
    timeout_s: float = 30.0
    max_body_bytes: int = 8 * 1024 * 1024
    max_inputs: int = 256  # strings per embeddings request, rows per /v1/infer request
    max_restarts: int = 5  # per worker within restart_window_s before it is given up
    restart_window_s: float = 60.0
    request_helpers: int = 2  # processes preparing large requests, started on first need; 0: all inline
    # decoders
    slots: int = SERVE_SLOTS  # sequences decoded at once per decoder (KV slots of ctx positions, reserved at start)
    ctx: int | None = None  # positions per sequence; None: the bundle's (an HF dir: its limit, at most 2048)
    prefill_chunk: int | None = None  # prompt tokens per prefill call between decode steps (None: 128)
    generation_timeout_s: float = 300.0
    threads: int | None = None  # CPU threads of a decoder worker (backends with a "threads" option); None: default
    in_process: bool = False  # decoders on a thread of the HTTP process instead of a worker process each

    def check(self) -> ServeConfig:
        if not self.bundles:
            raise InputError("give at least one BUNDLE directory to serve (create one with `edgeinfer deploy`)")
        if not (math.isfinite(self.batch_window_ms) and math.isfinite(self.timeout_s)):
            raise InputError("--batch-window-ms and --timeout-s must be finite numbers")
        if self.max_batch < 1:
            raise InputError(f"--max-batch must be at least 1, got {self.max_batch}")
        if self.batch_window_ms < 0:
            raise InputError(f"--batch-window-ms must be 0 or more, got {self.batch_window_ms}")
        if self.max_queue < 1:
            raise InputError(f"--max-queue must be at least 1, got {self.max_queue}")
        if self.timeout_s <= 0:
            raise InputError(f"--timeout-s must be positive, got {self.timeout_s}")
        if self.max_inputs < 1:
            raise InputError(f"--max-inputs must be at least 1, got {self.max_inputs}")
        if self.request_helpers < 0:
            raise InputError(f"--request-helpers must be 0 or more, got {self.request_helpers}")
        if self.slots < 1:
            raise InputError(f"--slots must be at least 1, got {self.slots}")
        if self.ctx is not None and self.ctx < 1:
            raise InputError(f"--ctx must be at least 1, got {self.ctx}")
        if self.threads is not None and self.threads < 1:
            raise InputError(f"--threads must be at least 1, got {self.threads}")
        if self.in_process and self.devices:
            raise InputError("--in-process runs decoders on the default device of the HTTP process; drop --devices "
                             "(or --in-process, for a worker process per decoder)")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise InputError(f"--prefill-chunk must be at least 1, got {self.prefill_chunk}")
        if not (math.isfinite(self.generation_timeout_s) and self.generation_timeout_s > 0):
            raise InputError(f"--generation-timeout-s must be positive, got {self.generation_timeout_s}")
        if not 0 <= self.port <= 65535:
            raise InputError(f"--port must be 0..65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise InputError(f"the API key (--api-key or {API_KEY_ENV}) is empty; give a non-empty key or none")
        if self.api_key is not None:
            check_text(self.api_key, f"the API key (--api-key or {API_KEY_ENV})")
        return self

    def spin_wait(self, decoders: int, cpus: int | None = None) -> bool | None:
        """False when ``decoders`` decoder workers would together run more CPU threads than the machine has
        (several of them, at the backends' default threads or ``threads`` each): a backend's idle threads then
        stop busy-waiting, which would take the cores a busy neighbour needs. None otherwise: the backend's own
        default. Two host w8a8 decoders on 2 cores, both busy: 394 tok/s together busy-waiting, 533 without
        (``--threads 1``: 674, but one busy decoder alone then runs at one thread: 363 against 558);
        bench/serve_shared_cpu.py, docs/serve.md "Several decoders on one CPU"."""
        cpus = cpus or os.cpu_count() or 1
        if decoders < 2 or (self.threads is not None and self.threads * decoders <= cpus):
            return None
        return False


MAX_BODY_MB = 1024


def body_bytes(mb: float) -> int:
    """``--max-body-mb`` in bytes: positive and at most 1 GiB (the whole body is held in memory)."""
    if not (math.isfinite(mb) and 0 < mb <= MAX_BODY_MB):
        raise InputError(f"--max-body-mb must be above 0 and at most {MAX_BODY_MB}, got {mb:g}")
    return max(1, int(mb * 1024 * 1024))


def parse_devices(text: str | None) -> list[str]:
    """``"0,1"`` → ``["0", "1"]``: one worker per entry (an index, or a device name such as CPU or NPU)."""
    if not text:
        return []
    items = [t.strip() for t in text.split(",")]
    if any(not t for t in items):
        raise InputError(f"--devices {text!r} has an empty entry; use a comma list such as 0,1 or CPU")
    return items


def api_key_from_env(given: str | None) -> str | None:
    return given if given is not None else (os.environ.get(API_KEY_ENV) or None)


MAX_KEY_FILE = 4096


def api_key_from_file(path: Path) -> str:
    """The key in ``path`` (one line; surrounding whitespace and the newline are dropped)."""
    hint = "give a readable file holding the key on one line"
    try:
        if path.is_file():
            with path.open("rb") as f:
                data: bytes | None = f.read(MAX_KEY_FILE + 1)
        else:
            data = None
    except OSError as e:
        raise InputError(f"--api-key-file {path}: cannot read it ({e.strerror or e})", hint) from None
    if data is None:
        what = "is a directory" if path.is_dir() else "not a regular file" if path.exists() else "no such file"
        raise InputError(f"--api-key-file {path}: {what}", hint)
    if len(data) > MAX_KEY_FILE:
        raise InputError(f"--api-key-file {path}: larger than {MAX_KEY_FILE} bytes, not a key file", hint)
    try:
        key = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError(f"--api-key-file {path}: not UTF-8 text", hint) from None
    if not key or len(key.splitlines()) != 1:
        raise InputError(f"--api-key-file {path}: {'empty' if not key else 'holds several lines'}", hint)
    return key


def authorized(key: bytes | None, path: str, authorization: bytes) -> bool:
    """Whether a request with this ``Authorization`` header may reach ``path``: any, without a key; else a
    ``Bearer`` token equal to the key (compared in constant time), except on the open paths. The single-box
    server and the Ray router both ask this."""
    import hmac

    if key is None or path in OPEN_PATHS:
        return True
    scheme, _, given = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), key)


def resolve_api_key(given: str | None, file: Path | None) -> str | None:
    """The key from ``--api-key``, ``--api-key-file`` or the environment (in that order); never two of them."""
    if given is not None and file is not None:
        raise InputError("give --api-key or --api-key-file, not both (a file keeps the key out of `ps`)")
    return api_key_from_file(file) if file is not None else api_key_from_env(given)
