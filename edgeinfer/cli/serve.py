"""The ``serve`` command. Starlette, uvicorn and the runtimes are imported inside the command only."""

from __future__ import annotations

from pathlib import Path

import click

from edgeinfer.errors import BackendUnavailableError, InputError
from edgeinfer.serve.config import API_KEY_ENV, ServeConfig, body_bytes, parse_devices, resolve_api_key

EXTRAS = ("uvicorn", "starlette", "pydantic", "prometheus_client", "h11")


@click.command("serve")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=int, help="TCP port (0: any free port).")
@click.option("--max-batch", default=ServeConfig.max_batch, show_default=True, type=int,
              help="Most rows merged into one run.")
@click.option(
    "--batch-window-ms", default=10.0, show_default=True, type=float, help="How long a batch waits to fill."
)
@click.option(
    "--devices",
    default=None,
    help="One worker process per entry, e.g. 0,1 (card indices, NPU core masks) or CPU,NPU; default one worker.",
)
@click.option("--api-key", default=None,
              help=f"Require 'Authorization: Bearer KEY' (visible in `ps`: prefer --api-key-file or {API_KEY_ENV}).")
@click.option("--api-key-file", default=None, type=click.Path(path_type=Path),
              help="Read the API key from this file (one line).")
@click.option("--max-queue", default=1024, show_default=True, type=int, help="Queued requests before 429.")
@click.option("--timeout-s", default=30.0, show_default=True, type=float, help="Per-request timeout (504).")
@click.option("--max-body-mb", default=8.0, show_default=True, type=float, help="Largest request body (413).")
@click.option("--max-inputs", default=256, show_default=True, type=int,
              help="Most strings per embeddings or classify request, documents per rerank request, rows per "
                   "/v1/infer request (400 above).")
@click.option("--request-helpers", default=2, show_default=True, type=int,
              help="Processes that prepare large requests and chat templates off the event loop, started when "
                   "first needed (~70 MiB each); 0: all in the HTTP process (docs/serve.md).")
@click.option("--slots", default=ServeConfig.slots, show_default=True, type=int,
              help="Decoders: sequences decoded at once (KV slots of --ctx positions each, reserved at start; "
                   "a bundle with static decode batches takes at most its largest).")
@click.option("--ctx", default=None, type=int,
              help="Decoders: positions per sequence (prompt + max_tokens); default the bundle's context.")
@click.option("--prefill-chunk", default=None, type=int,
              help="Decoders: prompt tokens per prefill call between decode steps [default: 128].")
@click.option("--generation-timeout-s", default=300.0, show_default=True, type=float,
              help="Decoders: longest generation (streams end with an error event, others get 504).")
@click.option("--threads", default=None, type=int,
              help="Decoders: CPU threads of the decoder worker, for backends that take it (default: theirs).")
@click.option("--in-process", is_flag=True,
              help="Decoders: run each on a thread of the HTTP process, not in a worker process of its own: one "
                   "interpreter less (~40 MiB), but a runtime crash stops the server (docs/serve.md).")
@click.option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning"]))
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS",
              help="Serve as Ray Serve deployments placed by accelerator (docs/fleet.md); auto: a local Ray.")
@click.option("--replicas", default="1", show_default=True, metavar="N|auto",
              help="With --ray: replicas per bundle; auto: scale on queue length within the fleet's resources.")
@click.option("--max-replicas", default=None, type=int,
              help="With --ray: scale on queue length from --replicas up to this many per bundle.")
@click.option("--ship-bundles", is_flag=True,
              help="With --ray: send bundles to the nodes through Ray's object store even where their path exists.")
@click.option("--dry-run", is_flag=True,
              help="With --ray: print the placement (deployments, resources per replica, replica bounds, nodes) "
                   "and exit; nothing is started (docs/fleet.md).")
@click.option("--json", "as_json", is_flag=True,
              help="With --dry-run: the placement as JSON. A failure to start (busy port, missing bundle, ...) as "
                   "one JSON error object on stdout.")
def serve_cmd(
    bundles: tuple[Path, ...],
    host: str,
    port: int,
    max_batch: int,
    batch_window_ms: float,
    devices: str | None,
    api_key: str | None,
    api_key_file: Path | None,
    max_queue: int,
    timeout_s: float,
    max_body_mb: float,
    max_inputs: int,
    request_helpers: int,
    slots: int,
    ctx: int | None,
    prefill_chunk: int | None,
    generation_timeout_s: float,
    threads: int | None,
    in_process: bool,
    log_level: str,
    ray_address: str | None = None,
    replicas: str = "1",
    max_replicas: int | None = None,
    ship_bundles: bool = False,
    dry_run: bool = False,
    as_json: bool = False,  # read by the CLI group, which prints a failure as JSON
) -> None:
    """Serve BUNDLE(s) over HTTP: /v1/embeddings, /v1/rerank, /v1/classify, /v1/infer, /v1/chat/completions,
    /v1/completions, /v1/models, /health, /ready, /metrics. Decoder bundles, Hugging Face decoder
    directories and decoder files (.gguf, .rkllm) are served with continuous batching."""
    config = ServeConfig(
        bundles=list(bundles),
        host=host,
        port=port,
        max_batch=max_batch,
        batch_window_ms=batch_window_ms,
        devices=parse_devices(devices),
        api_key=resolve_api_key(api_key, api_key_file),
        max_queue=max_queue,
        timeout_s=timeout_s,
        max_body_bytes=body_bytes(max_body_mb),
        max_inputs=max_inputs,
        request_helpers=request_helpers,
        slots=slots,
        ctx=ctx,
        prefill_chunk=prefill_chunk,
        generation_timeout_s=generation_timeout_s,
        threads=threads,
        in_process=in_process,
    ).check()
    if dry_run and not ray_address:
        raise InputError("--dry-run shows the placement of --ray; pass --ray auto|ADDRESS with it")
    if ray_address and in_process:
        raise InputError("--in-process is for one server process; with --ray each replica runs its decoder in a "
                         "worker process of its own: drop --in-process")
    if ray_address and dry_run:
        from edgeinfer.fleet.ray_serve import dry_run as show_placement

        return show_placement(config, ray_address, replicas, max_replicas, as_json)
    if ray_address:
        from edgeinfer.fleet.ray_serve import serve_on_ray

        return serve_on_ray(config, ray_address, replicas, max_replicas, ship_bundles)
    serve = _app_serve()
    serve(config, log_level=log_level)


def _app_serve():
    """The server, imported only now (Starlette, uvicorn); their absence is exit 3 with the install line."""
    try:
        import uvicorn  # noqa: F401 - imported by serve() itself, once the bundles are open

        from edgeinfer.serve.app import serve
    except ImportError as e:
        if (e.name or "").split(".")[0] not in EXTRAS:
            raise
        from edgeinfer.contract.packages import install_line

        raise BackendUnavailableError(f"edgeinfer serve needs {e.name}, which is not installed",
                                      install_line("edgeinfer[serve]"), kind="package_missing") from None
    return serve
