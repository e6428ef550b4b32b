"""The ``serve`` command. FastAPI, uvicorn and the runtimes are imported inside the command only."""

from __future__ import annotations

from pathlib import Path

import click

from .config import API_KEY_ENV, ServeConfig, api_key_from_env, parse_devices


@click.command("serve")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=int, help="TCP port (0: any free port).")
@click.option("--max-batch", default=32, show_default=True, type=int, help="Most rows merged into one run.")
@click.option(
    "--batch-window-ms", default=10.0, show_default=True, type=float, help="How long a batch waits to fill."
)
@click.option(
    "--devices",
    default=None,
    help="One worker process per entry, e.g. 0,1 (Ascend cards, RKNN cores) or CPU,NPU; default one worker.",
)
@click.option("--api-key", default=None, help=f"Require 'Authorization: Bearer KEY' (or set {API_KEY_ENV}).")
@click.option("--max-queue", default=1024, show_default=True, type=int, help="Queued requests before 429.")
@click.option("--timeout-s", default=30.0, show_default=True, type=float, help="Per-request timeout (504).")
@click.option("--max-body-mb", default=8.0, show_default=True, type=float, help="Largest request body (413).")
@click.option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning"]))
def serve_cmd(
    bundles: tuple[Path, ...],
    host: str,
    port: int,
    max_batch: int,
    batch_window_ms: float,
    devices: str | None,
    api_key: str | None,
    max_queue: int,
    timeout_s: float,
    max_body_mb: float,
    log_level: str,
) -> None:
    """Serve BUNDLE(s) over HTTP: /v1/embeddings, /v1/infer, /v1/models, /health, /ready, /metrics."""
    config = ServeConfig(
        bundles=list(bundles),
        host=host,
        port=port,
        max_batch=max_batch,
        batch_window_ms=batch_window_ms,
        devices=parse_devices(devices),
        api_key=api_key_from_env(api_key),
        max_queue=max_queue,
        timeout_s=timeout_s,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
    ).check()
    from .app import serve  # fastapi / uvicorn only now

    serve(config, log_level=log_level)
