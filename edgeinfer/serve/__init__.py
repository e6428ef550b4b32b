"""``edgeinfer serve``: an HTTP service over bundles with dynamic batching.

Layout: :mod:`.config` (options), :mod:`.app` (FastAPI app and uvicorn server),
:mod:`.batcher` (queue, merge, split), :mod:`.workers` (one process per device,
restart on crash), :mod:`.metrics` (Prometheus). Nothing here imports FastAPI,
uvicorn or an ML runtime at package import: :mod:`.cli` stays light.
"""
