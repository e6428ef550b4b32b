"""Hugging Face decoder -> GGUF: llama.cpp's own ``convert_hf_to_gguf.py`` (from the llama.cpp source of the
installed llama-cpp-python version) writes an F32 GGUF once per model (cached), then the binding
``llama_model_quantize`` writes the asked scheme from it (fp16, gguf:Q8_0, gguf:Q4_K_M ...).

The source tree: ``$EDGEINFER_LLAMACPP_SOURCE``, else ``<edgeinfer cache>/llama.cpp/<version>/src``; when missing,
the exact source distribution is fetched with pip (``pip download --no-deps --no-binary :all:
llama-cpp-python==<version>``) and its ``vendor/llama.cpp`` extracted there.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from edgeinfer.contract import cache, remote_code
from edgeinfer.contract.helpers import package_version
from edgeinfer.contract.stamp import sha256_file
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError

GGUF = "model.gguf"
SOURCE_ENV = "EDGEINFER_LLAMACPP_SOURCE"
CONVERTER = "convert_hf_to_gguf.py"
# edgeinfer scheme -> llama.cpp's LLAMA_FTYPE_* name (include/llama.h); gguf:<TYPE> -> LLAMA_FTYPE_MOSTLY_<TYPE>
FTYPES = {"fp32": "LLAMA_FTYPE_ALL_F32", "fp16": "LLAMA_FTYPE_MOSTLY_F16", "bf16": "LLAMA_FTYPE_MOSTLY_BF16"}


def version() -> str:
    v = package_version("llama-cpp-python", None)
    if not v:
        raise BackendUnavailableError("llama-cpp-python is not installed",
                                      "pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36 (make dev)")
    return v


def source_tree() -> Path:
    """The llama.cpp tree of the installed llama-cpp-python version (fetched into the cache when missing)."""
    given = os.environ.get(SOURCE_ENV)
    if given:
        src = Path(given)
        if not (src / CONVERTER).is_file():
            raise InputError(f"${SOURCE_ENV}={given} holds no {CONVERTER}; point it at a llama.cpp source tree")
        return src
    src = cache.root() / "llama.cpp" / version() / "src"
    if not (src / CONVERTER).is_file():
        with cache.locked(src):  # a concurrent fetch waits for this one's tree
            if not (src / CONVERTER).is_file():
                fetch_source(version(), src)
    return src


def fetch_source(ver: str, dst: Path) -> None:
    """``vendor/llama.cpp`` of the llama-cpp-python ``ver`` source distribution into ``dst``."""
    print(f"fetching the llama.cpp source of llama-cpp-python {ver} (its converter) into {dst}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-llamacpp-src-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", tmp,
               f"llama-cpp-python=={ver}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            raise BackendUnavailableError(f"could not fetch the llama-cpp-python {ver} source distribution",
                                          f"set ${SOURCE_ENV} to a llama.cpp source tree of that version")
        part = dst.with_name(dst.name + ".partial")
        shutil.rmtree(part, ignore_errors=True)
        with tarfile.open(sdists[0]) as tar:
            top = f"{sdists[0].name[: -len('.tar.gz')]}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(top) and (m.isfile() or m.isdir())]
            for m in members:
                m.name = m.name[len(top):]
            tar.extractall(part, members=[m for m in members if m.name], filter="data")
        shutil.rmtree(dst, ignore_errors=True)
        part.rename(dst)


def to_f32_gguf(hf_dir: Path) -> Path:
    """llama.cpp's converter on ``hf_dir`` at F32, once per model directory and converter (cached)."""
    src = source_tree()
    trust = remote_code.allowed(hf_dir)
    entry = cache.area("artifacts") / "llamacpp" / cache.key(
        {"model": sha256_file(hf_dir), "llama-cpp-python": version(), "source": str(src), "trust": trust})

    def build(d: Path) -> None:
        script = Path(__file__).with_name("hf_to_gguf.py")
        cmd = [sys.executable, str(script), str(src), "1" if trust else "0", str(hf_dir), "--outfile",
               str(d / GGUF), "--outtype", "f32"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not (d / GGUF).is_file():
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            raise ModelError(f"llama.cpp's {CONVERTER} could not convert {hf_dir.name}: "
                             f"{lines[-1] if lines else 'no output'}")

    return cache.fill(entry, build) / GGUF


def quantize(src: Path, scheme: str, out: Path, threads: int | None = None) -> None:
    """``src`` (F32 GGUF) written as ``scheme`` at ``out`` by llama.cpp's ``llama_model_quantize``."""
    from .decoder import clear_errors, lib, llama_error

    ll = lib()

    if scheme == "fp32":
        shutil.copyfile(src, out)
        return
    name = FTYPES.get(scheme) or f"LLAMA_FTYPE_MOSTLY_{scheme.split(':', 1)[-1]}"
    if not hasattr(ll, name):
        raise InputError(f"llama.cpp {version()} has no file type for {scheme} ({name})")
    params = ll.llama_model_quantize_default_params()
    params.ftype = getattr(ll, name)
    params.nthread = int(threads or 0)
    clear_errors()
    rc = ll.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0 or not out.is_file():
        raise ModelError(f"llama_model_quantize could not write {scheme} (returned {rc}){llama_error()}")


def cached_scheme(hf_dir: Path, scheme: str, threads: int | None = None) -> Path:
    """``hf_dir`` as a ``scheme`` GGUF in the cache (the F32 conversion, quantized once)."""
    f32 = to_f32_gguf(hf_dir)
    if scheme == "fp32":
        return f32
    entry = f32.parent.with_name(f"{f32.parent.name}-{scheme.replace(':', '-')}")
    return cache.fill(entry, lambda d: quantize(f32, scheme, d / GGUF, threads)) / GGUF
