"""llama.cpp for bench/peer_llamacpp.py: ``llama-server`` / ``llama-quantize`` built from the llama.cpp source
tree the ``llamacpp`` plugin uses (``edgeinfer_llamacpp.convert.source_tree``: the installed llama-cpp-python's
sdist), GGUF files made by the plugin's own converter wrapper and quantizer (``cached_scheme``), and the key
that ties a cached peer bundle to the code that built it.

The CMake options are llama.cpp's documented ones (https://github.com/ggml-org/llama.cpp/blob/master/docs/build.md):
a native CPU build, no libcurl / OpenSSL (no model downloads), no web UI (by default the build fetches a
prebuilt one), no tests or examples."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

from edgeinfer_llamacpp.convert import cached_scheme, source_tree, version
from edgeinfer_llamacpp.decoder import amx_build
from edgeinfer_llamacpp.decoder import init_backend as lib

from edgeinfer.contract import cache

CMAKE_FLAGS = ["-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DCMAKE_BUILD_TYPE=Release"]
TARGETS = ["llama-server", "llama-quantize"]
#: GGUF type -> the plugin's scheme (``gguf:<TYPE>`` for llama.cpp's quantized types)
SCHEMES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}

__all__ = ["CMAKE_FLAGS", "binaries", "code_key", "gguf", "server_command", "version"]


def binaries(log: list[str] | None = None) -> dict[str, Path]:
    """``llama-server`` and ``llama-quantize`` built from the plugin's :func:`source_tree` (built here when
    missing; a few minutes on 2 cores). Appends what it did to ``log``."""
    src = source_tree()
    build = src.parent / "build"
    bins = {t: build / "bin" / t for t in TARGETS}
    if all(p.exists() for p in bins.values()):
        return bins
    t0 = time.perf_counter()
    jobs = str(os.cpu_count() or 2)
    for cmd in (["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS],
                ["cmake", "--build", str(build), "-j", jobs, "--target", *TARGETS]):
        print("+", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
    if log is not None:
        log.append(f"built {', '.join(TARGETS)} in {time.perf_counter() - t0:.0f} s")
    return bins


def gguf(model: Path, kind: str) -> Path:
    """``model`` as a GGUF of type ``kind`` (F32, F16, Q8_0, Q4_K_M, Q4_0, ...), as the ``llamacpp`` plugin
    writes it (llama.cpp's converter at F32, then ``llama_model_quantize``; cached by the plugin)."""
    return cached_scheme(model, SCHEMES.get(kind, f"gguf:{kind}"))


def code_key(backend: str) -> str:
    """What a cached peer bundle was built by: edgeinfer's and the backend plugin's versions and the hash of
    both packages' source (a dev tree changes without a version bump)."""
    import edgeinfer

    b = edgeinfer.backend(backend)
    plugin = Path(importlib.import_module(type(b).__module__.split(".")[0]).__file__).parent
    core = Path(edgeinfer.__file__).parent
    return cache.key({"edgeinfer": edgeinfer.__version__, "versions": b.versions(),
                      "source": cache.source_digest([core, plugin])}, length=16)


def server_command(bins: dict[str, Path], model: Path, port: int, parallel: int, ctx: int, threads: int) -> list[str]:
    """``llama-server`` with ``parallel`` slots of ``ctx`` positions each (its ``-c`` is the total, split
    between the slots) and continuous batching (its default); KV cache in its default f16. Without prompt
    caching (``--no-cache-prompt``, ``--cache-ram 0``): edgeinfer has none, and the bench sends the same prompts
    every round, whose KV llama-server would otherwise reuse (and keep in RAM)."""
    return [str(bins["llama-server"]), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(parallel), "-c", str(ctx * parallel), "--threads", str(threads),
            "--threads-batch", str(threads), "--no-webui", "--no-cache-prompt", "--cache-ram", "0",
            *(["--no-repack"] if amx_build(lib()) else [])]  # as the plugin does (edgeinfer_llamacpp.decoder)
