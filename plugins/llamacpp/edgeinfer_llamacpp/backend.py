"""Decoders on llama.cpp through llama-cpp-python (built from its source distribution): GGUF files as they are,
Hugging Face decoders converted with llama.cpp's own converter, the step primitives over llama.cpp's batch API.

llama_cpp is imported inside the methods, never at plugin import. The Ascend boards' ``llama.cpp-cann`` runtime
is built by this backend too when llama-cpp-python was built with CANN (``CMAKE_ARGS="-DGGML_CANN=on"``,
llama.cpp docs/backend/CANN.md); that build was never run here.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.contract import Backend, Decoders, Probe, Problem, verbose
from edgeinfer.contract.helpers import first_line, package_version
from edgeinfer.contract.native_output import native_output
from edgeinfer.contract.records import Needs
from edgeinfer.errors import InputError, ModelError

VERSION = "0.3.36"  # the llama-cpp-python release this plugin is written and tested against
INSTALL = (f'CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" pip install --no-binary llama-cpp-python '
           f"llama-cpp-python=={VERSION} (or make dev)")
CANN_INSTALL = (f'CMAKE_ARGS="-DGGML_CANN=on" pip install --no-binary llama-cpp-python llama-cpp-python=={VERSION} '
                "with the CANN toolkit's set_env.sh sourced (llama.cpp docs/backend/CANN.md; never run here)")
CPU_DEVICES = (None, "", "cpu", "CPU", "auto")
NPU_DEVICES = ("npu", "NPU", "cann", "CANN")


def lib_dir() -> Path | None:
    """llama_cpp's bundled shared libraries, found without importing it (plan stays light)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


@dataclass(frozen=True)
class CannBuild(Needs):
    """llama-cpp-python built with llama.cpp's CANN backend: its ``libggml-cann.so`` next to ``libllama.so``."""

    def missing(self) -> str | None:
        d = lib_dir()
        if d is not None and any(d.glob("libggml-cann.so*")):
            return None
        return f"{self.what} is not installed: {self.get}"


CANN = CannBuild("llama_cpp", "llama-cpp-python built with CANN (libggml-cann.so)", CANN_INSTALL)


def close_devnull() -> None:
    """llama_cpp._utils opens os.devnull twice at import and never closes it; Python reports that at exit as a
    ResourceWarning on stderr, which breaks the one-line error a script reads (``ray-node`` probes backends)."""
    utils = sys.modules.get("llama_cpp._utils")
    for name in ("outnull_file", "errnull_file"):
        f = getattr(utils, name, None)
        if f is not None and not f.closed:
            f.close()


atexit.register(close_devnull)


def quiet_logs() -> None:
    """llama.cpp's log lines: on stderr only when the user asked for third-party output (--verbose). Ours
    (decoder._log), set again by every ``lib()``; between an ``import llama_cpp`` and the next ``lib()`` the
    package's logger has them: its level is set here too."""
    from .decoder import lib

    lib()
    logging.getLogger("llama-cpp-python").setLevel(logging.DEBUG if verbose() else logging.ERROR)


class LlamaCppBackend(Backend):
    name = "llamacpp"
    decoders = Decoders(
        schemes=("fp16", "fp32", "gguf:Q8_0", "gguf:Q4_K_M", "gguf:Q4_0", "gguf:Q4_1"),
        options=("precision", "threads", "kv_dtype"),
        native={".gguf": "llama.cpp"},
        builds={"llama.cpp": None, "llama.cpp-cann": CANN},
    )

    def versions(self) -> dict[str, str]:
        return {"edgeinfer-llamacpp": package_version("edgeinfer-llamacpp", "?"),
                "toolkit": f"llama-cpp-python {package_version('llama-cpp-python', 'missing')}"}

    def probe(self) -> Probe:
        try:
            import llama_cpp
        except Exception as e:
            return Probe(False, problems=[Problem(f"llama-cpp-python does not import: {first_line(e)}", INSTALL)])
        problems = []
        if llama_cpp.__version__ != VERSION:
            problems.append(Problem(f"llama-cpp-python {llama_cpp.__version__} is installed; this plugin is "
                                    f"written against {VERSION}", INSTALL))
        cann = CANN.missing()
        details = {"system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                   "cann": "built with CANN (never run here)" if cann is None else
                   f"not built with CANN (the llama.cpp-cann runtime of the Ascend boards; never run here): "
                   f"{CANN_INSTALL}"}
        return Probe(True, versions={"llama-cpp-python": llama_cpp.__version__}, problems=problems,
                     devices=["CPU"] + (["NPU"] if cann is None else []), details=details)

    @native_output()
    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any):
        from .decoder import LlamaCppDecoder

        quiet_logs()
        if device in NPU_DEVICES and CANN.missing():
            raise InputError(f"this llama-cpp-python is built for CPU only, not {device!r}", CANN_INSTALL)
        if device not in CPU_DEVICES + NPU_DEVICES:
            raise InputError(f"llamacpp runs on CPU (or an Ascend NPU with a CANN build), not {device!r}; omit "
                             "--device or use CPU")
        gguf = self._gguf(model, options.pop("precision", None), options.get("threads"))
        return LlamaCppDecoder(gguf, context, slots, threads=options.get("threads"),
                               kv_dtype=str(options.get("kv_dtype") or "fp16").lower(),
                               offload=device in NPU_DEVICES)

    def open_vocabulary(self, path: Path):
        """A lone ``.gguf``'s own vocabulary and chat template (llama.cpp's tokenizer)."""
        from .vocab import GgufVocabulary

        if not (path.is_file() and path.suffix.lower() == ".gguf"):
            return None
        quiet_logs()
        return GgufVocabulary(path)

    def _gguf(self, model: Path, precision: str | None, threads: int | None) -> Path:
        """The GGUF to load: a .gguf as it is, the file of a convert_decoder artifact, or a Hugging Face
        directory converted (cached) at ``precision`` (default fp32)."""
        from .convert import GGUF, cached_scheme

        if model.is_file():
            if model.suffix.lower() != ".gguf":
                raise ModelError(f"{model.name} is not a .gguf file; give a GGUF file or a Hugging Face directory")
            return model
        if (model / GGUF).is_file():
            return model / GGUF
        if not (model / "config.json").is_file():
            raise ModelError(f"{model} is neither a Hugging Face decoder directory nor a llamacpp artifact")
        return cached_scheme(model, self._scheme(precision or "fp32"), threads)

    def _scheme(self, name: str) -> str:
        from edgeinfer.contract.schemes import normalize_scheme

        scheme = normalize_scheme(name).name
        if scheme not in self.decoders.schemes:
            raise InputError(f"precision {name!r}: llamacpp converts to {', '.join(self.decoders.schemes)}")
        return scheme

    @native_output()
    def convert_decoder(self, model: Path, scheme: str, context: int, out: Path, calibration=None, **options: Any):
        from .convert import GGUF, quantize, to_f32_gguf, version

        options.pop("target", None)  # a GGUF runs on any target llama.cpp was built for
        quiet_logs()
        quantize(to_f32_gguf(model), scheme, out / GGUF)
        return {"target": "cpu", "converter": f"llama.cpp convert_hf_to_gguf.py (llama-cpp-python {version()})"}
