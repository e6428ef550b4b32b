"""llama.cpp for bench/peer_llamacpp.py: the source tree inside the installed llama-cpp-python's sdist, the
``llama-server`` / ``llama-quantize`` build from it, and GGUF files of a Hugging Face model made with llama.cpp's
own converter (convert_hf_to_gguf.py) and quantizer, cached under ~/.cache/edgeinfer/.

The CMake options are llama.cpp's documented ones (https://github.com/ggml-org/llama.cpp/blob/master/docs/build.md):
a native CPU build, no libcurl / OpenSSL (no model downloads), no web UI (by default the build fetches a
prebuilt one), no tests or examples."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

CMAKE_FLAGS = ["-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DCMAKE_BUILD_TYPE=Release"]
TARGETS = ["llama-server", "llama-quantize"]

# The converter's Qwen2/Qwen3 vocabulary code imports sentencepiece before it looks for tokenizer.model (and
# falls back to the GPT-2 style BPE vocabulary only on FileNotFoundError), and it knows pre-tokenizers by a
# hash of a fixed text's tokens: the test tokenizer (ByteLevel with GPT-2's split regex, see
# edgeinfer/testing/data/tiny-qwen3/tokenizer.json) is not in its list, so it is named "gpt-2" here.
CONVERT = r"""
import sys, types
try:
    import sentencepiece  # noqa: F401
except ImportError:
    sys.modules["sentencepiece"] = types.SimpleNamespace(SentencePieceProcessor=None)
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
from conversion import base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = pre
import runpy
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def cache_root() -> Path:
    return Path(os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer")


def version() -> str:
    from importlib.metadata import version as v

    return v("llama_cpp_python")


def source_tree() -> Path:
    """llama.cpp's source as shipped in llama-cpp-python's sdist of the installed version: the extracted copy
    in the cache, or extracted from $EDGEINFER_LLAMACPP_SDIST (the sdist tarball) on first use."""
    ver = version()
    src = cache_root() / "llama.cpp" / ver / "src"
    if (src / "convert_hf_to_gguf.py").exists():
        return src
    sdist = os.environ.get("EDGEINFER_LLAMACPP_SDIST")
    if not sdist:
        raise SystemExit(f"no llama.cpp source at {src}: set EDGEINFER_LLAMACPP_SDIST to llama-cpp-python's "
                         f"sdist (llama_cpp_python-{ver}.tar.gz, `pip download --no-binary :all: "
                         f"--no-deps llama-cpp-python=={ver}`)")
    with tarfile.open(sdist) as tar:
        prefix = f"llama_cpp_python-{ver}/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(src, members=members, filter="data")
    return src


def binaries(log: list[str] | None = None) -> dict[str, Path]:
    """``llama-server`` and ``llama-quantize`` built from :func:`source_tree` (built here when missing; a few
    minutes on 2 cores). Appends what it did to ``log``."""
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
    """``model`` as a GGUF of type ``kind`` (F32, F16, Q8_0, Q4_K_M, Q4_0, ...): F32/F16 by the converter,
    the others by ``llama-quantize`` from the F16 file (llama.cpp's documented route). Cached by model path."""
    out_dir = cache_root() / "bench" / "gguf" / model.name
    out = out_dir / f"{kind}.gguf"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    if kind in ("F32", "F16"):
        subprocess.run([sys.executable, "-c", CONVERT, str(source_tree()), str(model), "--outtype", kind.lower(),
                        "--outfile", str(tmp)], check=True, capture_output=True)
    else:
        subprocess.run([str(binaries()["llama-quantize"]), str(gguf(model, "F16")), str(tmp), kind], check=True,
                       capture_output=True)
    tmp.rename(out)
    return out


def server_command(bins: dict[str, Path], model: Path, port: int, parallel: int, ctx: int, threads: int) -> list[str]:
    """``llama-server`` with ``parallel`` slots of ``ctx`` positions each (its ``-c`` is the total, split
    between the slots) and continuous batching (its default); KV cache in its default f16. Without prompt
    caching (``--no-cache-prompt``, ``--cache-ram 0``): edgeinfer has none, and the bench sends the same prompts
    every round, whose KV llama-server would otherwise reuse (and keep in RAM)."""
    return [str(bins["llama-server"]), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(parallel), "-c", str(ctx * parallel), "--threads", str(threads),
            "--threads-batch", str(threads), "--no-webui", "--no-cache-prompt", "--cache-ram", "0"]
