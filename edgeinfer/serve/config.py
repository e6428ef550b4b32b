"""Options of ``edgeinfer serve`` as one value object (shared by the CLI, the app and the tests)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError

API_KEY_ENV = "EDGEINFER_API_KEY"


@dataclass
class ServeConfig:
    bundles: list[Path]
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 32
    batch_window_ms: float = 10.0
    devices: list[str] = field(default_factory=list)  # one worker per entry; [] → one worker, default device
    api_key: str | None = None
    max_queue: int = 1024  # queued (not yet running) requests, all models together
    timeout_s: float = 30.0
    max_body_bytes: int = 8 * 1024 * 1024
    max_inputs: int = 2048  # strings per embeddings request
    max_restarts: int = 5  # per worker within restart_window_s before it is given up
    restart_window_s: float = 60.0

    def check(self) -> ServeConfig:
        if not self.bundles:
            raise InputError("give at least one BUNDLE directory to serve (create one with `edgeinfer deploy`)")
        if self.max_batch < 1:
            raise InputError(f"--max-batch must be at least 1, got {self.max_batch}")
        if self.batch_window_ms < 0:
            raise InputError(f"--batch-window-ms must be 0 or more, got {self.batch_window_ms}")
        if self.max_queue < 1:
            raise InputError(f"--max-queue must be at least 1, got {self.max_queue}")
        if self.timeout_s <= 0:
            raise InputError(f"--timeout-s must be positive, got {self.timeout_s}")
        if not 0 <= self.port <= 65535:
            raise InputError(f"--port must be 0..65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise InputError(f"the API key (--api-key or {API_KEY_ENV}) is empty; give a non-empty key or none")
        return self


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
