"""ONNX on CPU with onnxruntime: the reference every NPU backend is checked against.

onnxruntime and onnx are imported inside the methods, never at plugin import.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import Backend, CalibrationSet, Decoders, OpTime, Probe, Problem, Session, Tensors, TensorSpec
from edgeinfer.contract.helpers import check_device, first_line, package_version
from edgeinfer.contract.native_output import native_output
from edgeinfer.contract.stamp import refuses_newer
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError

from .blocks import CONVERSION_DEFAULTS

if TYPE_CHECKING:
    import numpy as np

DEVICES = ("cpu", "auto")
# the model_type of each causal LM onnxruntime-genai's model builder exports (0.14: create_model in
# src/python/py/models/builder.py dispatches on config.architectures[0]; each class's model_type from
# transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES). Its multimodal and remote-code classes are left out.
ARCHITECTURES = ("ernie4_5", "gemma", "gemma2", "gemma3_text", "gpt_oss", "granite", "hunyuan_v1_dense", "lfm2",
                 "llama", "mistral", "nemotron", "olmo", "phi", "phi3", "qwen2", "qwen3", "smollm3")

# onnxruntime type strings → NumPy dtype names
ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


def _ort():
    import onnxruntime

    return onnxruntime


def specs_of(nodes: Any) -> list[TensorSpec]:
    return [
        TensorSpec(n.name, tuple(d if isinstance(d, (int, str)) else None for d in n.shape), ORT_TYPES.get(n.type,
                                                                                                           n.type))
        for n in nodes
    ]


class OnnxRuntimeSession(Session):
    def __init__(self, path: Path, threads: int | None = None, profile_dir: Path | None = None):
        ort = _ort()
        self._path = path
        self._threads = threads
        self._sess = ort.InferenceSession(str(path), self._options(), providers=["CPUExecutionProvider"])
        super().__init__(specs_of(self._sess.get_inputs()), specs_of(self._sess.get_outputs()), device="CPU")
        self._names = [o.name for o in self._sess.get_outputs()]

    def _options(self, profile_prefix: str | None = None) -> Any:
        opts = _ort().SessionOptions()
        # serve runs batches of every length: a memory pattern is traced and kept per input shape
        # (https://onnxruntime.ai/docs/api/python/api_summary.html#onnxruntime.SessionOptions.enable_mem_pattern),
        # which grew a MiniLM session's arena from one batch's peak to about twice it (docs/planner.md, chain)
        opts.enable_mem_pattern = False
        if self._threads:
            opts.intra_op_num_threads = self._threads
        if profile_prefix:
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_prefix
        return opts

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._names, self._sess.run(self._names, feeds)))

    def op_times(self, feeds: dict[str, np.ndarray]) -> list[OpTime]:
        """Per-node times from onnxruntime's own profiler (one profiled run after a warm-up)."""
        with tempfile.TemporaryDirectory(prefix="edgeinfer-ort-prof-") as tmp:
            sess = _ort().InferenceSession(
                str(self._path), self._options(os.path.join(tmp, "ort")), providers=["CPUExecutionProvider"]
            )
            sess.run(None, feeds)  # warm-up, also profiled; keep only the last run's events
            sess.run(None, feeds)
            events = json.loads(Path(sess.end_profiling()).read_text())
        return node_times(events)

    def release(self) -> None:
        self._sess = None


def node_times(events: list[dict[str, Any]]) -> list[OpTime]:
    """Aggregate the last run's 'Node' events of an onnxruntime profile."""
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    start = runs[-1]["ts"] if runs else 0
    totals: dict[str, float] = defaultdict(float)
    kinds: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or e.get("ts", 0) < start or not e["name"].endswith("_kernel_time"):
            continue
        node = e["name"][: -len("_kernel_time")]
        totals[node] += e.get("dur", 0) / 1e3
        kinds[node] = e.get("args", {}).get("op_name", "")
    return [OpTime(name=n, op_type=kinds[n], time_ms=t, exec_type="CPUExecutionProvider") for n, t in totals.items()]


class _Reader:
    """onnxruntime's CalibrationDataReader over an edgeinfer CalibrationSet."""

    def __init__(self, calibration: CalibrationSet):
        self._it = iter(calibration)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:  # not used: one pass is enough for MinMax calibration
        pass


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    # deploy passes a backend that declares them the board's target and the shapes it exported with: a CPU model
    # runs on any target and keeps its own (dynamic) shapes, so both are accepted and change nothing
    tensors = Tensors(native=(".onnx",), schemes=("fp32", "fp16", "w8a8"),
                      convert_options=("per_channel", "shapes", "target"), open_options=("threads",))
    decoders = Decoders(schemes=("fp32", "fp16", "w8a16", "w8a8", "w4a16", "w4a8"), architectures=ARCHITECTURES,
                        options=("precision", "threads", "spin_wait", "kv_dtype"),
                        convert_options=("target", "kv_dtype"),
                        defaults=CONVERSION_DEFAULTS)

    def versions(self) -> dict[str, str]:
        out = {"edgeinfer-onnxruntime": package_version("edgeinfer-onnxruntime", "?"),
               "toolkit": f"onnxruntime {package_version('onnxruntime', 'missing')}"}
        genai = package_version("onnxruntime-genai", None)
        if genai:  # what exports decoders: part of a decoder conversion's cache key
            out["onnxruntime-genai"] = genai
        return out

    def refuses_toolkit(self, made: str, have: str) -> str | None:
        # newer onnxruntime releases run every model older ones ran
        # (https://onnxruntime.ai/docs/reference/compatibility.html); the own ops bind onnxruntime's C API
        # table, which only grows (kernels/ort.h), and are compiled on the loading machine
        return refuses_newer(made, have)

    def refuses_target(self, target: str, device: str | None) -> str | None:
        from .custom_ops import TARGET, library_problem

        problem = library_problem() if target == TARGET else None
        if problem:  # this machine's lack (a C compiler), not the bundle's fault: exit 3, as custom_ops.library's
            raise BackendUnavailableError(problem)
        return None

    def probe(self) -> Probe:
        try:
            ort = _ort()
        except Exception as e:
            return Probe(
                available=False,
                problems=[Problem(f"onnxruntime does not import: {e}", "pip install onnxruntime")],
            )
        from .custom_ops import OPS, compiler, isa, unavailable

        reason, runs = unavailable(), isa()
        build = f"{runs} build" + (" (loads bundles with them; deploy builds onnxruntime's forms on this CPU)"
                                   if runs == "portable" else "")
        details: dict[str, Any] = {"providers": ort.get_available_providers(), "own_ops": (
            ", ".join(f"edgeinfer.{op} ({', '.join(s for s, o in OPS.items() if o == op)})" for op in dict.fromkeys(
                OPS.values())) + f", {build}" if reason is None else f"none: {reason}")}
        if reason is not None and compiler() is None:  # a CPU without the instructions: nothing to fix
            details["warnings"] = [{"message": f"edgeinfer's fp16, w8a16 and int4 decoder ops cannot be built "
                                               f"({reason}): those schemes deploy on onnxruntime's own kernels, "
                                               "slower, and a bundle deployed with the ops on another machine does "
                                               "not load here (docs/generation.md)",
                                    "fix": "install a C compiler (apt install gcc), then deploy again or load "
                                           "such a bundle"}]
        return Probe(available=True, versions={"onnxruntime": ort.__version__}, devices=["CPU"], details=details)

    @native_output()
    def convert(
        self, model: Path, scheme: str, calibration: CalibrationSet | None, out: Path, **options: Any
    ) -> dict[str, Any]:
        import onnx

        try:
            proto = onnx.load(str(model))
            onnx.checker.check_model(proto)
        except Exception as e:
            raise InputError(f"{model.name} is not a valid ONNX model: {first_line(e)}") from None
        method = ""
        if scheme == "fp32":
            onnx.save(proto, str(out))
        elif scheme == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            onnx.save(convert_float_to_float16(proto, keep_io_types=True), str(out))
        else:  # w8a8: static INT8 with a calibration set, dynamic (activations at run time) without
            method = self._quantize_int8(model, calibration, out, options)
        inputs = specs_of(_ort().InferenceSession(str(out), providers=["CPUExecutionProvider"]).get_inputs())
        if calibration is not None:
            calibration.check(inputs)
        return {"target": "cpu", "inputs": inputs, **({"method": method} if method else {})}

    def _quantize_int8(self, model: Path, calibration: CalibrationSet | None, out: Path, options: dict) -> str:
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

        if calibration is None:
            quantize_dynamic(str(model), str(out), weight_type=QuantType.QInt8)
            return "dynamic"
        sess_inputs = specs_of(_ort().InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs())
        calibration.check(sess_inputs)
        quantize_static(
            str(model),
            str(out),
            _Reader(calibration),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=bool(options.get("per_channel", True)),
        )
        return "static"

    @native_output()
    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any):
        from edgeinfer.contract import cache

        from .decoder import open_decoder

        if device not in (None, "", "cpu", "CPU", "auto"):
            raise InputError(f"onnxruntime backend runs on CPU only, not {device!r}; omit --device or use CPU")
        return open_decoder(model, context, slots, cache.area("artifacts"), dict(options))

    @native_output()
    def convert_decoder(self, model: Path, scheme: str, context: int, out: Path, calibration=None, **options: Any):
        from edgeinfer.contract.schemes import normalize_scheme

        from .decoder import convert

        options.pop("target", None)  # a CPU model runs on any target
        # calibration is not used: int4 (Q4_1 blocks, or the builder's where the own ops cannot be built) and int8
        # are round-to-nearest per block, data-free
        return convert(model, scheme, context, out, normalize_scheme(scheme).group_size,
                       options.pop("kv_dtype", "fp16"))

    @native_output()
    def open(self, artifact: Path, device: str | None, stamp: dict[str, Any], **options: Any) -> Session:
        check_device(device, DEVICES, self.name)
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

        try:
            return OnnxRuntimeSession(artifact, threads=options.get("threads"))
        except ort_errors.InvalidProtobuf as e:
            why = first_line(e).rpartition("failed:")[2].strip().rstrip(".") or first_line(e)
            raise ModelError(f"{artifact.name} is not a valid ONNX model (onnxruntime: {why}); check the file, "
                             "or export the model to ONNX again") from None
        except (ort_errors.Fail, ort_errors.InvalidGraph, ort_errors.InvalidArgument, ort_errors.NoSuchFile,
                ort_errors.NotImplemented) as e:  # the model the user gave: a missing weights file, an unknown op
            raise ModelError(f"onnxruntime cannot load {artifact.name}: {first_line(e, 300)}; check the model "
                             "file and the files it names, or export it to ONNX again") from None
