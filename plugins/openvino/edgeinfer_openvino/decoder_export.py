"""Decoder (causal LM) export to a stateful OpenVINO IR, and its weight formats.

The export is optimum-intel's (``optimum.exporters.openvino.main_export`` with
``task="text-generation-with-past"``, https://github.com/huggingface/optimum-intel): one
``openvino_model.xml`` whose KV cache is model state, plus the tokenizer and detokenizer
as OpenVINO models (openvino-tokenizers), the layout ``openvino_genai.LLMPipeline`` reads.

One fp32 export per source model is cached; the schemes derive from it:

* ``fp32``: the export as is; ``fp16``: ``ov.save_model(compress_to_fp16=True)`` of it;
* ``w8a16``: INT8 weight-only. ``target="cpu"``: asymmetric in blocks of 128 along the input dimension
  (``group_size`` sets the block, -1 one block a row), written by :mod:`edgeinfer_openvino.int8_blocks`;
  ``npu`` / ``gpu``: NNCF's per-channel INT8 (symmetric for the NPU), what those plugins document;
* ``w4a16`` / ``w4a16_gN``: INT4 weight-only, ratio 1.0 (the embedding / head stay INT8 as NNCF
  decides). ``target="npu"`` gets **symmetric** INT4, channel-wise above 1B weights, else group
  128 (the NPU supports only symmetric 4-bit, https://github.com/openvinotoolkit/openvino/pull/27489);
  CPU/GPU get optimum-intel's default asymmetric group 128.

The board runtimes ``openvino-gpu`` and ``openvino-cpu`` (a Core Ultra board's built-in GPU and its CPU cores;
deploy passes the convert option ``runtime``) build that device's formats: ``target="gpu"`` / ``"cpu"`` whatever
the board's own target (its NPU).

Quantization goes through ``OVModelForCausalLM.from_pretrained(ir, quantization_config=
OVWeightQuantizationConfig(...))``; with calibration text, INT4 runs NNCF's data-aware AWQ and
scale estimation. What NNCF recorded as having run (the IR's ``nncf/weight_compression`` rt_info)
goes into the facts.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract import remote_code
from edgeinfer.contract.helpers import check_weight_index
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError

from . import int8_blocks

SCHEMES = ("fp32", "fp16", "w8a16", "w4a16", "w4a16_g32", "w4a16_g64", "w4a16_g128")
TARGETS = ("cpu", "gpu", "npu")
CONVERT_OPTIONS = ("target", "group_size", "num_samples", "runtime")  # OpenVinoBackend.decoders.convert_options
# board runtimes besides the board's own that the export builds for (OpenVinoBackend.decoders.runtimes)
RUNTIME_TARGETS = {"openvino-gpu": "gpu", "openvino-cpu": "cpu"}
# the model_types optimum-intel 2.2.0 exports with task "text-generation-with-past" (the model types its
# TasksManager registers for the "openvino" exporter and that task): OpenVinoBackend.decoders.architectures
ARCHITECTURES = (
    "afmoe", "aquila", "arcee", "arctic", "baichuan", "bart", "bigbird_pegasus", "biogpt", "bitnet", "blenderbot",
    "blenderbot-small", "bloom", "chatglm", "codegen", "cohere", "cohere2", "dbrx", "deci", "deepseek", "deepseek_v2",
    "deepseek_v3", "exaone", "exaone4", "falcon", "falcon_mamba", "gemma", "gemma2", "gemma3_text", "gemma3n_text",
    "gemma4_text", "gemma4_unified_text", "glm", "glm4", "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox",
    "gpt_neox_japanese", "gpt_oss", "gptj", "granite", "granitemoe", "granitemoehybrid", "hunyuan_v1_dense",
    "internlm", "internlm2", "jais", "lfm2", "lfm2_moe", "llama", "llama4", "llama4_text", "llava-qwen2", "maira2",
    "mamba", "marian", "mbart", "minicpm", "minicpm3", "mistral", "mixtral", "mpt", "muse_glimmer_text", "olmo",
    "olmo2", "opt", "orion", "ouro", "pegasus", "persimmon", "phi", "phi3", "phimoe", "qwen", "qwen2", "qwen2_moe",
    "qwen3", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe", "qwen3_next", "qwen3_omni_moe_talker_text",
    "qwen3_omni_moe_text", "qwen3_vl_text", "smollm3", "stablelm", "starcoder2", "xglm", "xverse", "zamba2")
IR = "openvino_model.xml"
FACTS = "edgeinfer_decoder.json"
#: models above this many parameters get channel-wise symmetric INT4 for the NPU
CHANNELWISE_ABOVE = 1_000_000_000
TOKENIZER_IRS = ("openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml",
                 "openvino_detokenizer.bin")
_KEEP = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json", "chat_template.jinja", *TOKENIZER_IRS)


def is_ir(path: Path) -> bool:
    """An exported decoder: a directory with the stateful IR (and, from edgeinfer, its facts)."""
    return path.is_dir() and (path / IR).is_file()


@contextlib.contextmanager
def without_tokenizer_irs(path: Path) -> Iterator[Path]:
    """``path`` as a directory of links to its files but the tokenizer and detokenizer IRs, for GenAI to open.
    A pipeline compiles them whenever they are there, and edgeinfer never calls them (token ids go in and come
    out): on SmolLM2-135M's 49,152-token vocabulary they held 9 MiB of a served worker's anonymous memory
    (bench/README.md). The bundle keeps them for whoever opens its IR with GenAI's own tokenizer. Where no
    temporary directory of links can be made (a read-only /tmp), ``path`` itself."""
    if not any((path / name).exists() for name in TOKENIZER_IRS):
        yield path
        return
    try:
        tmp = Path(tempfile.mkdtemp(prefix="edgeinfer-genai-"))
    except OSError:
        yield path
        return
    try:
        try:
            for f in path.iterdir():
                if f.name not in TOKENIZER_IRS:
                    (tmp / f.name).symlink_to(f.resolve())
            view = tmp
        except OSError:
            view = path
        yield view
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_facts(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / FACTS).read_text())
    except (OSError, ValueError):
        return {}


def cpu_build(facts: dict[str, Any]) -> bool:
    """Whether an IR's facts (:func:`read_facts`) say its weights only the CPU was shown to run: w8a16 in int8
    blocks (target cpu)."""
    return facts.get("weight_compression", {}).get("method") == int8_blocks.METHOD


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("optimum-intel", "optimum", "openvino", "nncf", "openvino-tokenizers", "transformers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "missing"
    return out


def _require_optimum() -> None:
    if versions()["optimum-intel"] == "missing":
        raise BackendUnavailableError(
            "optimum-intel is not installed, so decoders cannot be exported to OpenVINO",
            "pip install optimum-intel==2.2.0 optimum==2.3.0 --no-deps (see requirements-dev.txt for why --no-deps)",
        )


def check_convert(scheme: str, options: dict[str, Any]) -> tuple[str, int | None, int | None]:
    if scheme not in SCHEMES:
        raise InputError(f"scheme {scheme!r} is not an OpenVINO decoder format; use one of {', '.join(SCHEMES)}")
    target = str(options.get("target") or "cpu").lower()
    runtime = options.get("runtime")
    if runtime is not None:
        if runtime not in RUNTIME_TARGETS:
            raise InputError(f"runtime must be one of {', '.join(RUNTIME_TARGETS)} (or none: the board's own), "
                             f"got {runtime!r}")
        target = RUNTIME_TARGETS[runtime]
    if target not in TARGETS:
        raise InputError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    group = options.get("group_size")
    if "_g" in scheme:
        group = int(scheme.rsplit("_g", 1)[1])
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group == 0 or group < -1):
        raise InputError(f"group_size must be a positive integer or -1 (channel-wise), got {group!r}")
    if scheme == "w8a16" and target != "cpu" and group not in (None, -1):
        raise InputError(f"w8a16 for target {target} is channel-wise (NNCF's INT8, what the {target.upper()} "
                         "plugin documents); group_size applies to target cpu")
    samples = options.get("num_samples")
    if samples is not None and (not isinstance(samples, int) or samples < 1):
        raise InputError(f"num_samples must be a positive integer, got {samples!r}")
    return target, group, samples


def base_export(model: Path, cache_root: Path) -> Path:
    """The fp32 stateful IR of the Hugging Face causal LM ``model``, exported once and cached."""
    from edgeinfer.contract import cache
    from edgeinfer.contract.stamp import sha256_file

    if not (model / "config.json").is_file():
        raise ModelError(f"{model} is not a Hugging Face model directory (no config.json) nor an OpenVINO decoder")
    check_weight_index(model)  # the IR's own files have fixed names; only the source's index names paths
    _require_optimum()
    trust = remote_code.allowed(model)
    entry = cache_root / "openvino-decoders" / cache.key({"source": sha256_file(model), "stage": "fp32-export",
                                                          "versions": versions()})
    with cache.locked(entry):  # a concurrent export of the same model waits for this one's result
        if not cache.reusable(entry, lambda msg: print(msg, file=sys.stderr)):
            _export_fp32(model, trust, entry)
    return entry


def _export_fp32(model: Path, trust: bool, entry: Path) -> None:
    from optimum.exporters.openvino import main_export
    from optimum.intel.openvino.configuration import OVConfig

    from edgeinfer.contract import cache

    with tempfile.TemporaryDirectory(prefix="ov-export-") as tmp:
        try:
            main_export(str(model), output=tmp, task="text-generation-with-past", library_name="transformers",
                        ov_config=OVConfig(dtype="fp32"), convert_tokenizer=True, trust_remote_code=trust,
                        local_files_only=True)
        except Exception as e:
            raise ModelError(f"optimum-intel could not export {model.name} to OpenVINO: {_first_line(e)}") from e
        entry.parent.mkdir(parents=True, exist_ok=True)
        cache.store(entry, Path(tmp))


def weight_config(scheme: str, target: str, group: int | None, params: int,
                  calibration: Sequence[str] | None, samples: int | None, tokenizer: Path) -> Any:
    """optimum-intel's OVWeightQuantizationConfig for ``scheme`` on ``target``."""
    from optimum.intel import OVWeightQuantizationConfig

    sym = target == "npu"
    data: dict[str, Any] = {}
    if calibration:
        data = {"dataset": list(calibration), "tokenizer": str(tokenizer),
                "num_samples": samples or len(calibration)}
    if scheme == "w8a16":
        return OVWeightQuantizationConfig(bits=8, sym=sym, group_size=-1, **data)
    if group is None:
        group = -1 if sym and params > CHANNELWISE_ABOVE else 128
    if calibration:
        data.update(quant_method="awq", scale_estimation=True)
    return OVWeightQuantizationConfig(bits=4, sym=sym, group_size=group, ratio=1.0, group_size_fallback="adjust",
                                      **data)


def convert(model: Path, scheme: str, context: int, out: Path, calibration: Sequence[str] | None,
            options: dict[str, Any], cache_root: Path) -> dict[str, Any]:
    """Write the ``scheme`` decoder for ``model`` to the directory ``out``; return its facts."""
    target, group, samples = check_convert(scheme, dict(options))
    if isinstance(calibration, str):
        calibration = [calibration]
    if calibration is not None and not all(isinstance(t, str) and t.strip() for t in calibration):
        raise InputError("calibration for a decoder is a list of non-empty texts")
    base = base_export(model, cache_root)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent if out.parent.is_dir() else None))
    try:
        compression = _write_scheme(base, work, scheme, target, group, calibration, samples, model)
        facts = {"scheme": scheme, "target": target, "context": int(context), "weight_compression": compression,
                 "export": "optimum-intel main_export text-generation-with-past (stateful)",
                 "toolkit_version": f"openvino {versions()['openvino']}", "versions": versions()}
        (work / FACTS).write_text(json.dumps(facts, indent=1))
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(work), str(out))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return facts


def _write_scheme(base: Path, work: Path, scheme: str, target: str, group: int | None,
                  calibration: Sequence[str] | None, samples: int | None, source: Path) -> dict[str, Any]:
    import openvino as ov

    for name in _KEEP:
        if (base / name).is_file():
            shutil.copy2(base / name, work / name)
    if scheme in ("fp32", "fp16"):
        m = ov.Core().read_model(base / IR)
        ov.save_model(m, work / IR, compress_to_fp16=scheme == "fp16")
        return {"method": "none", "weights": scheme}
    if scheme == "w8a16" and target == "cpu":
        m = ov.Core().read_model(base / IR)
        done = int8_blocks.compress(m, int8_blocks.BLOCK if group is None else group)
        ov.save_model(m, work / IR, compress_to_fp16=False)  # the norms stay fp32, as in NNCF's IRs
        return {**done, "data_aware": False, "calibration_samples": 0}
    from optimum.intel import OVModelForCausalLM

    params = _parameter_count(source)
    cfg = weight_config(scheme, target, group, params, calibration, samples, source)
    try:
        with _quiet_hub_probe():
            m = OVModelForCausalLM.from_pretrained(base, quantization_config=cfg, compile=False,
                                                   trust_remote_code=remote_code.allowed(source),
                                                   local_files_only=True)
        m.save_pretrained(work)
    except Exception as e:
        raise ModelError(f"NNCF weight compression ({scheme}) failed: {_first_line(e)}") from e
    recorded = recorded_compression(work / IR)
    recorded["data_aware"] = bool(calibration)
    recorded["calibration_samples"] = len(calibration) if calibration else 0
    return recorded


@contextlib.contextmanager
def _quiet_hub_probe():
    """optimum-intel probes a local directory as a Hub cache entry when ``local_files_only`` (``model_id.replace``
    on our Path) and logs the failure as a warning ("Could not infer whether the model was already converted
    ... Path.replace() takes 2 positional arguments"); it then keeps ``export=False``, which is right for an IR."""
    import logging

    def keep(record: logging.LogRecord) -> bool:
        return "Could not infer whether the model was already converted" not in record.getMessage()

    log = logging.getLogger("optimum.intel.openvino.modeling_base")
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def recorded_compression(xml: Path) -> dict[str, Any]:
    """What NNCF wrote into the IR's rt_info about the weight compression that ran."""
    import openvino as ov

    info = ov.Core().read_model(xml).get_rt_info()
    out: dict[str, Any] = {"method": "nncf.compress_weights"}
    try:
        wc = info["nncf"]["weight_compression"]
        for k in ("mode", "group_size", "ratio", "awq", "scale_estimation", "gptq", "backup_mode", "all_layers"):
            with contextlib.suppress(Exception):
                out[k] = _plain(wc[k].astype(str))
    except Exception:
        pass
    return out


def _plain(s: str) -> Any:
    low = s.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        with contextlib.suppress(ValueError):
            return cast(s)
    return s


def _parameter_count(model: Path) -> int:
    try:
        cfg = json.loads((model / "config.json").read_text())
        h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        inter = cfg.get("intermediate_size", 4 * h)
        return vocab * h + layers * (4 * h * h + 3 * h * inter)
    except (OSError, ValueError, KeyError):
        return 0


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__
