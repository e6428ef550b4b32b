"""OpenVINO IR on Intel Core Ultra NPU, Intel GPU and CPU; quantization with NNCF.

openvino, nncf and onnx are imported inside the methods, never at plugin import.

Conversion (``Backend.quantize`` → :meth:`OpenVinoBackend.convert`) writes ``.xml`` + ``.bin``:

* ``fp32`` / ``fp16``: ``ov.save_model(..., compress_to_fp16=...)`` (fp16 weights, fp32 I/O);
* ``w8a8``: NNCF post-training quantization (``nncf.quantize``) on the CalibrationSet;
* ``w8a16``: NNCF weight compression INT8 (asymmetric, per channel);
* ``w4a16``: NNCF weight compression INT4 *symmetric* (what the NPU needs), group 128,
  or channel-wise (``group_size=-1``) for models above 1B parameters.

Options of ``convert``: ``shapes={"input_ids": [1, 128], ...}`` (reshape to static shapes),
``target="npu"`` (requires static shapes), ``group_size`` (w4a16), ``model_type`` ("transformer"
or "none"; default: transformer when the graph has a Softmax), ``subset_size`` (w8a8).

Options of ``open``: ``cache_dir`` (compiled-model cache), ``hint`` ("LATENCY" or "THROUGHPUT"),
``threads`` (INFERENCE_NUM_THREADS), ``num_requests`` (size of the run_many queue),
``config`` (extra OpenVINO properties, passed through).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import Backend, CalibrationSet, OpTime, Probe, Problem, Session, TensorSpec, validate_feeds
from edgeinfer.contract.backend import DeviceReading
from edgeinfer.contract.helpers import first_line, package_version
from edgeinfer.contract.onnx_io import onnx_io
from edgeinfer.contract.resources import Accelerator
from edgeinfer.errors import BackendError, EdgeInferError, InputError, ModelError

from . import decoder_config, decoder_export, resources
from .devices import clean, cpu_model_name, diagnose, fallback_warning, family, requested_primary, select_device

log = logging.getLogger("edgeinfer.openvino")

HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
CONVERT_OPTIONS = ("board", "group_size", "model_type", "shapes", "subset_size", "target")
OPEN_OPTIONS = ("cache_dir", "config", "hint", "num_requests", "precision", "threads")
PRECISIONS = {"f32": "f32", "fp32": "f32", "bf16": "bf16", "f16": "f16", "fp16": "f16"}
#: models above this many weights get channel-wise INT4 (group_size=-1), as the NPU needs
CHANNELWISE_ABOVE = 1_000_000_000
NPU_PROPERTIES = {
    "name": "FULL_DEVICE_NAME",
    "architecture": "DEVICE_ARCHITECTURE",
    "driver_version": "NPU_DRIVER_VERSION",
    "compiler_version": "NPU_COMPILER_VERSION",
    "total_memory_bytes": "NPU_DEVICE_TOTAL_MEM_SIZE",
    "gops": "DEVICE_GOPS",
}


class DeviceFallbackWarning(RuntimeWarning):
    """The compiled model does not run on the device that was asked for (e.g. NPU → CPU)."""


def _ov():
    import openvino

    return openvino


@contextlib.contextmanager
def _nncf_output_to_stderr():
    """NNCF logs and draws progress bars on stdout; stdout belongs to the CLI's answer (--json).
    They go to stderr with ``edgeinfer --verbose``, and nowhere otherwise (edgeinfer shows its own step)."""
    from edgeinfer.progress import verbose

    handler = None
    try:
        from nncf.common.logging.logger import stdout_handler as handler
    except Exception:
        pass
    with contextlib.ExitStack() as stack:
        sink = sys.stderr if verbose() else stack.enter_context(open(os.devnull, "w"))
        old = handler.setStream(sink) if handler is not None else None
        try:
            with contextlib.redirect_stdout(sink):
                yield
        finally:
            if handler is not None and old is not None:
                handler.setStream(old)


def _reason(e: BaseException) -> str:
    """The informative line of an OpenVINO exception (skipping its 'Exception from src/...' frames)."""
    return first_line(e, 240, skip=lambda ln: ln.startswith(("Exception from ", "Check '")) or ln.endswith(":"))


def _dims(pshape: Any, names: Sequence[Any] | None = None) -> tuple[Any, ...]:
    out = []
    for i, d in enumerate(pshape):
        if d.is_static:
            out.append(d.get_length())
        else:
            out.append(names[i] if names and i < len(names) and isinstance(names[i], str) else None)
    return tuple(out)


def _port_name(port: Any, i: int, prefix: str, known: Mapping[str, Any] | None = None) -> str:
    """A port's tensor name; when it has several (an ONNX Identity folded away), the one the
    source model used (``known``: names from the ONNX graph or the stamp)."""
    try:
        names = sorted(port.get_names())
    except Exception:
        names = []
    if known:
        for n in names:
            if n in known:
                return n
    try:
        return port.get_any_name()
    except Exception:  # an unnamed port
        return names[0] if names else f"{prefix}{i}"


def port_specs(ports: Sequence[Any], prefix: str, symbols: Mapping[str,
                                                                   Sequence[Any]] | None = None) -> list[TensorSpec]:
    """TensorSpecs of OpenVINO ports; dynamic dims take their symbolic names from ``symbols``."""
    specs = []
    for i, p in enumerate(ports):
        name = _port_name(p, i, prefix, symbols)
        pshape = p.get_partial_shape()
        names = (symbols or {}).get(name)
        if names is not None and (pshape.rank.is_dynamic or len(names) != pshape.rank.get_length()):
            names = None
        dims = _dims(pshape, names) if pshape.rank.is_static else ()
        specs.append(TensorSpec(name, dims, np.dtype(p.get_element_type().to_dtype()).name))
    return specs


def onnx_dim_names(path: Path) -> dict[str, list[str | None]]:
    """Symbolic dim names (dim_param) of an ONNX model's inputs and outputs; {} if unreadable."""
    if path.suffix.lower() != ".onnx":
        return {}
    try:
        import onnx

        inputs, outputs = onnx_io(onnx.load(str(path), load_external_data=False))
    except Exception:
        return {}
    return {s.name: [d if isinstance(d, str) else None for d in s.shape] for s in inputs + outputs}


def weight_count(model: Any) -> int:
    """Number of floating-point weights (rank >= 2 constants) in an OpenVINO model."""
    total = 0
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        et = op.get_output_element_type(0)
        shape = op.get_output_shape(0)
        if et.is_real() and len(shape) >= 2:
            total += int(np.prod(list(shape)))
    return total


def int4_group_size(weights: int, requested: int | None = None) -> int:
    """Group size for INT4 weight compression: channel-wise (-1) above 1B weights, else 128."""
    if requested is not None:
        return int(requested)
    return -1 if weights > CHANNELWISE_ABOVE else 128


def check_ir_xml(path: Path) -> None:
    """Refuse an .xml that is not a well-formed OpenVINO IR (root element <net>) before OpenVINO sees it:
    otherwise OpenVINO hands the file to every frontend, and TensorFlow's prints parse errors on stderr."""
    import xml.etree.ElementTree as ET

    root = None
    try:
        for _, elem in ET.iterparse(str(path), events=("start",)):  # the whole document must be well-formed
            if root is None:
                root = elem
    except ET.ParseError as e:
        raise ModelError(
            f"{path.name} is not a readable OpenVINO IR: malformed XML ({e}); convert the model again"
        ) from None
    if root is None or root.tag != "net":
        raise ModelError(
            f"{path.name} is not a readable OpenVINO IR: its root element is "
            f"<{getattr(root, 'tag', '')}>, not <net>; "
            "convert the model again"
        )


def _read(core: Any, path: Path) -> Any:
    if path.suffix.lower() == ".xml":
        if not path.with_suffix(".bin").exists():
            raise ModelError(f"{path.name}: its weights file {path.with_suffix('.bin').name} is missing; copy it "
                             "next to the .xml or convert the model again")
        check_ir_xml(path)
    try:
        if path.suffix.lower() == ".onnx":
            # the ONNX frontend alone: read_model would also try TensorFlow's, which prints on stderr
            from openvino.frontend import FrontEndManager

            fe = FrontEndManager().load_by_framework("onnx")
            return fe.convert(fe.load(str(path)))
        return core.read_model(str(path))
    except Exception as e:
        kind = "OpenVINO IR" if path.suffix.lower() == ".xml" else "model (ONNX)"
        raise ModelError(
            f"{path.name} is not a readable {kind}: {_reason(e)}; check the file or convert/export it again"
        ) from None


class OpenVinoSession(Session):
    """One compiled model. ``run`` is synchronous; :meth:`run_many` pipelines many feeds through
    an ``AsyncInferQueue``."""

    def __init__(
        self,
        path: Path,
        device: str | None,
        *,
        cache_dir: str | Path | None = None,
        hint: str | None = None,
        threads: int | None = None,
        num_requests: int | None = None,
        config: Mapping[str, Any] | None = None,
        precision: str | None = None,
        scheme: str | None = None,
        symbols: Mapping[str, Sequence[Any]] | None = None,
    ):
        ov = _ov()
        self._path = path
        self._core = ov.Core()
        self.requested_device = device or "auto"
        self.ov_device = select_device(device, self._core.available_devices)
        hint = (hint or "LATENCY").upper()
        if hint not in HINTS:
            raise InputError(f"unknown performance hint {hint!r}; use one of: {', '.join(HINTS)}")
        self._config: dict[str, Any] = {"PERFORMANCE_HINT": hint}
        if threads:
            self._config["INFERENCE_NUM_THREADS"] = int(threads)
        self._config.update(precision_config(self.ov_device, scheme, precision))
        self._cache_dir = Path(cache_dir) if cache_dir else None
        if self._cache_dir is not None:
            self._cache_dir.mkdir(parents=True, exist_ok=True)
            self._config["CACHE_DIR"] = str(self._cache_dir)
        self._config.update(dict(config or {}))

        before = self._cache_files()
        t0 = time.perf_counter()
        if self._cache_dir is not None:
            # compile from the path: with a warm cache OpenVINO imports the blob without reading the IR
            if path.suffix.lower() == ".xml":
                if not path.with_suffix(".bin").exists():
                    _read(self._core, path)  # raises the one-line "weights file missing" error
                check_ir_xml(path)
            try:
                self._compiled = self._core.compile_model(str(path), self.ov_device, self._config)
            except Exception as e:
                _read(self._core, path)  # a corrupt file gets the ModelError; otherwise it is the device
                raise BackendError(f"OpenVINO could not compile {path.name} for {self.ov_device}: "
                                   f"{_reason(e)}") from None
            self._model = None
        else:
            self._model = _read(self._core, path)
            try:
                self._compiled = self._core.compile_model(self._model, self.ov_device, self._config)
            except Exception as e:
                raise BackendError(f"OpenVINO could not compile {path.name} for {self.ov_device}: "
                                   f"{_reason(e)}") from None
        self.compile_ms = (time.perf_counter() - t0) * 1e3
        after = self._cache_files()
        self.cache = "off" if self._cache_dir is None else ("miss" if after - before else "hit")

        try:
            self.execution_devices = [clean(str(d)) for d in self._compiled.get_property("EXECUTION_DEVICES")]
        except Exception:
            self.execution_devices = []
        self.fallback = fallback_warning(self.ov_device, self.execution_devices)
        if self.fallback:
            log.debug(self.fallback)
            warnings.warn(self.fallback, DeviceFallbackWarning, stacklevel=4)
        try:
            self.optimal_requests = int(self._compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        except Exception:
            self.optimal_requests = 1
        self._num_requests = int(num_requests) if num_requests else None

        super().__init__(
            port_specs(self._compiled.inputs, "input", symbols),
            port_specs(self._compiled.outputs, "output", symbols),
            device=",".join(self.execution_devices) or self.ov_device,
        )
        self._out_names = [s.name for s in self.outputs]
        self._request = self._compiled.create_infer_request()
        self._lock = threading.Lock()
        self._queue: Any = None
        self._prof_request: Any = None
        self.first_inference_ms: float | None = None

    def _cache_files(self) -> set[str]:
        if self._cache_dir is None or not self._cache_dir.is_dir():
            return set()
        return {p.name for p in self._cache_dir.iterdir() if p.is_file()}

    # --- primitives -------------------------------------------------------------------------
    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            if self.first_inference_ms is None:
                t0 = time.perf_counter()
                res = self._request.infer(feeds)
                self.first_inference_ms = (time.perf_counter() - t0) * 1e3
            else:
                res = self._request.infer(feeds)
        return {name: res[i] for i, name in enumerate(self._out_names)}

    def run_many(self, feeds_list: Sequence[Mapping[str, Any]], jobs: int | None = None) -> list[dict[str,
                                                                                                      np.ndarray]]:
        """Run many feeds through an ``AsyncInferQueue`` (throughput path); results in input order."""
        self._check_open()
        arrays = [validate_feeds(self.inputs, f) for f in feeds_list]
        if not arrays:
            return []
        ov = _ov()
        try:
            with self._lock:
                size = int(jobs or self._num_requests or self.optimal_requests or 1)
                if self._queue is None or len(self._queue) != size:
                    # no Python callback: OpenVINO's worker threads then never need the GIL, which
                    # otherwise deadlocks when a compiled model is destroyed while a callback waits
                    self._queue = ov.AsyncInferQueue(self._compiled, size)
                job_of: list[int | None] = [None] * size
                results: list[Any] = [None] * len(arrays)
                for i, feeds in enumerate(arrays):
                    rid = self._queue.get_idle_request_id()  # blocks (GIL released) until one is idle
                    if job_of[rid] is not None:
                        results[job_of[rid]] = self._outputs_of(self._queue[rid])
                    job_of[rid] = i
                    self._queue.start_async(feeds, share_inputs=False)  # starts on that same idle request
                self._queue.wait_all()
                for rid, job in enumerate(job_of):
                    if job is not None:
                        results[job] = self._outputs_of(self._queue[rid])
        except EdgeInferError:
            raise
        except Exception as e:
            raise BackendError(f"openvino failed to run the model: {_reason(e)}") from e
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise BackendError(f"openvino returned no result for feed {missing[0]} of {len(results)}")
        return results

    def _outputs_of(self, request: Any) -> dict[str, np.ndarray]:
        return {name: request.get_output_tensor(i).data.copy() for i, name in enumerate(self._out_names)}

    def op_times(self, feeds: dict[str, np.ndarray]) -> list[OpTime]:
        """Per-op times from OpenVINO's performance counters (PERF_COUNT) of one run after a warm-up,
        on a second compilation of the same model (the main one stays counter-free)."""
        if self._prof_request is None:
            model = self._model if self._model is not None else str(self._path)
            config = {k: v for k, v in self._config.items() if k != "CACHE_DIR"}
            config["PERF_COUNT"] = True
            self._prof_request = self._core.compile_model(model, self.ov_device, config).create_infer_request()
        req = self._prof_request
        req.infer(feeds)  # warm-up
        req.infer(feeds)
        return perf_counts(req.get_profiling_info())

    def _property(self, name: str) -> Any:
        try:
            value = self._compiled.get_property(name)
        except Exception:
            return None
        return value.get_type_name() if hasattr(value, "get_type_name") else str(value)

    def profile_notes(self) -> dict[str, Any]:
        return {
            "openvino": _ov().__version__,
            "requested_device": self.requested_device,
            "device": self.ov_device,
            "execution_devices": self.execution_devices,
            "fallback": self.fallback,
            "performance_hint": self._config.get("PERFORMANCE_HINT"),
            "inference_precision": self._property("INFERENCE_PRECISION_HINT"),
            "compile_ms": self.compile_ms,
            "cache": self.cache,
            "cache_dir": str(self._cache_dir) if self._cache_dir else None,
            "first_inference_ms": self.first_inference_ms,
            "optimal_requests": self.optimal_requests,
        }

    def release(self) -> None:
        self._queue = None
        self._prof_request = None
        self._request = None
        self._compiled = None
        self._model = None


def precision_config(device: str, scheme: str | None, precision: str | None) -> dict[str, Any]:
    """OpenVINO properties that set INFERENCE_PRECISION_HINT for ``device``.

    An explicit ``precision`` wins. Otherwise float artifacts (fp32, fp16 weights, or unstamped)
    compute in f32 on the CPU, because OpenVINO's CPU default is bf16 wherever the CPU has
    AVX512-BF16/AMX, which would silently make "fp32" lossy. GPU/NPU and quantized artifacts keep
    OpenVINO's default. Virtual devices (AUTO:NPU,CPU) get it per device through DEVICE_PROPERTIES.
    """
    head, colon, tail = device.upper().partition(":")
    listed = [d.strip() for d in tail.split(",") if d.strip()] if colon else [head]
    if precision:
        key = str(precision).lower()
        if key not in PRECISIONS:
            raise InputError(f"unknown precision {precision!r}; use one of: f32, bf16, f16")
        per_device = {d: PRECISIONS[key] for d in listed}
    elif (scheme or "fp32") in ("fp32", "fp16"):
        per_device = {d: "f32" for d in listed if family(d) == "CPU"}
    else:
        per_device = {}
    if not per_device:
        return {}
    if not colon:
        return {"INFERENCE_PRECISION_HINT": per_device[head]}
    return {"DEVICE_PROPERTIES": {d: {"INFERENCE_PRECISION_HINT": v} for d, v in per_device.items()}}


def perf_counts(infos: Sequence[Any]) -> list[OpTime]:
    """OpTimes of executed nodes from ``get_profiling_info()``."""
    ops = []
    for info in infos:
        status = getattr(info.status, "name", str(info.status))
        if status != "EXECUTED":
            continue
        ops.append(
            OpTime(
                name=info.node_name,
                op_type=info.node_type,
                time_ms=info.real_time.total_seconds() * 1e3,
                exec_type=info.exec_type,
            )
        )
    return ops


def npu_details(get_property: Any) -> dict[str, Any]:
    """NPU facts through ``get_property(name)`` (``lambda p: core.get_property("NPU", p)``);
    properties the driver does not report are left out."""
    out: dict[str, Any] = {}
    for key, prop in NPU_PROPERTIES.items():
        try:
            value = get_property(prop)
        except Exception:
            continue
        out[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _accel_nodes() -> list[str]:
    d = Path("/dev/accel")
    return sorted(str(p) for p in d.iterdir()) if d.is_dir() else []


class OpenVinoBackend(Backend):
    name = "openvino"
    native_suffixes = (".xml",)
    schemes = ("fp32", "fp16", "w8a8", "w8a16", "w4a16", "w4a16_g32", "w4a16_g64", "w4a16_g128")
    decoder_schemes = ("fp16", "fp32", "w8a16", "w4a16")  # decoder_export.SCHEMES; fp16 first: lossless on CPU
    decoder_options = decoder_config.OPTIONS
    decoder_convert_options = decoder_export.CONVERT_OPTIONS
    logits_options = {"loop": "steps"}  # the golden check steps the IR through ov.Core (GenAI gives no logits)
    default_scheme = "fp32"
    gaps: dict[str, str] = {}
    convert_options = CONVERT_OPTIONS
    open_options = OPEN_OPTIONS
    resource_names = resources.RESOURCE_NAMES

    def accelerators(self, probe: Probe) -> list[Accelerator]:
        return resources.accelerators(probe)

    def artifact_files(self, artifact: Path) -> list[Path]:
        """An IR is the ``.xml`` graph and its ``.bin`` weights."""
        files = super().artifact_files(artifact)
        weights = artifact.with_suffix(".bin")
        return files + [weights] if weights != artifact and weights.exists() else files

    def versions(self) -> dict[str, str]:
        def v(dist: str) -> str:
            return package_version(dist, "missing")

        return {"edgeinfer-openvino": v("edgeinfer-openvino"), "toolkit": f"openvino {v('openvino')}",
                "nncf": v("nncf")}

    def device_readings(self, devices: Sequence[str]) -> list[DeviceReading]:
        """NPU and GPU memory as OpenVINO reports it (no utilisation: OpenVINO has no such property)."""
        from . import gauges

        return gauges.readings()

    def probe(self) -> Probe:
        cpu = cpu_model_name(_read_text("/proc/cpuinfo"))
        try:
            ov = _ov()
            core = ov.Core()
            devices = list(core.available_devices)
        except Exception as e:
            return Probe(
                available=False,
                problems=[Problem(f"openvino does not import or start: {_reason(e)}", "pip install -U openvino")],
            )
        details: dict[str, Any] = {"cpu": cpu, "devices": {}}
        for dev in devices:
            info = {}
            for key, prop in (("name", "FULL_DEVICE_NAME"), ("architecture", "DEVICE_ARCHITECTURE")):
                try:
                    info[key] = str(core.get_property(dev, prop))
                except Exception:
                    pass
            details["devices"][dev] = info
        npus = [d for d in devices if d.upper().split(".")[0] == "NPU"]
        if npus:
            details["npu"] = npu_details(lambda p: core.get_property(npus[0], p))
        problems = diagnose(cpu, devices, _accel_nodes())
        versions = {"openvino": ov.__version__}
        nncf = package_version("nncf")
        if nncf:
            versions["nncf"] = nncf
        else:
            problems.append(Problem("nncf is not installed: int8/w8a16/w4a16 conversion is unavailable",
                                    "pip install './plugins/openvino[convert]' (or: pip install nncf)"))
        return Probe(available=bool(devices), versions=versions, devices=devices, problems=problems, details=details)

    def refuses_target(self, target: str, device: str | None) -> str | None:
        if target == "dynamic" and device and requested_primary(device) == "NPU":
            return (
                "this IR has dynamic input shapes, which the NPU cannot compile; convert it again with static "
                "shapes (target='npu', shapes={'input_ids': [1, 128], ...})"
            )
        return None

    # --- convert ----------------------------------------------------------------------------
    def convert(
        self, model: Path, scheme: str, calibration: CalibrationSet | None, out: Path, **options: Any
    ) -> dict[str, Any]:
        ov = _ov()
        if out.suffix.lower() != ".xml":
            raise InputError(f"an OpenVINO IR is written as NAME.xml (+ NAME.bin), not {out.name}")
        bin_path = out.with_suffix(".bin")
        bin_path.unlink(missing_ok=True)
        try:
            return self._convert(ov, model, scheme, calibration, out, options)
        except BaseException:
            bin_path.unlink(missing_ok=True)
            raise

    def _convert(
        self, ov: Any, model: Path, scheme: str, calibration: CalibrationSet | None, out: Path, options: dict
    ) -> dict[str, Any]:
        core = ov.Core()
        ov_model = _read(core, model)
        symbols = onnx_dim_names(model)
        target = str(options.get("target") or "").lower()
        shapes = options.get("shapes")
        if shapes:
            self._reshape(ov, ov_model, shapes)
        static = all(p.get_partial_shape().is_static for p in ov_model.inputs)
        if target == "npu" and not static:
            dyn = [_port_name(p, i, "input") for i,
                   p in enumerate(ov_model.inputs) if p.get_partial_shape().is_dynamic]
            raise InputError(
                f"the NPU needs static input shapes but {', '.join(dyn)} are dynamic; pass "
                f"shapes={{{dyn[0]!r}: [1, 128], ...}} (e.g. --shapes / the board's shapes)"
            )
        inputs = port_specs(ov_model.inputs, "input", symbols)
        if calibration is not None:
            calibration.check(inputs)
        facts: dict[str, Any] = {}
        compress_fp16 = False
        if scheme == "fp16":
            compress_fp16 = True
        elif scheme == "w8a8":
            with _nncf_output_to_stderr():
                ov_model, facts = self._ptq(ov_model, calibration, target, options)
        elif scheme in ("w8a16", "w4a16") or scheme.startswith("w4a16_g"):
            if scheme.startswith("w4a16_g"):  # the group size is part of the scheme name
                if options.get("group_size") not in (None, int(scheme.split("_g")[1])):
                    raise InputError(f"scheme {scheme} fixes the group size; drop group_size={options['group_size']}")
                options = dict(options, group_size=int(scheme.split("_g")[1]))
            with _nncf_output_to_stderr():
                ov_model, facts = self._compress(ov_model, scheme.split("_g")[0], options)
        ov.save_model(ov_model, str(out), compress_to_fp16=compress_fp16)
        facts.update(
            target=target or ("any" if static else "dynamic"),
            inputs=inputs,
            outputs=[s.to_json() for s in port_specs(ov_model.outputs, "output", symbols)],
            **({"shapes": {k: list(v) for k, v in shapes.items()}} if shapes else {}),
        )
        return facts

    @staticmethod
    def _reshape(ov: Any, ov_model: Any, shapes: Any) -> None:
        if not isinstance(shapes, Mapping):
            raise InputError(f"shapes must map input names to shapes, e.g. {{'input_ids': [1, 128]}}; got {shapes!r}")
        names = [_port_name(p, i, "input") for i, p in enumerate(ov_model.inputs)]
        for name, shape in shapes.items():
            if name not in names:
                raise InputError(f"shapes: unknown input {name!r}; the model's inputs are: {', '.join(names)}")
            if not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
                raise InputError(f"shapes: {name} must be a list of positive integers, got {list(shape)!r}")
        try:
            ov_model.reshape({name: ov.PartialShape([int(d) for d in shape]) for name, shape in shapes.items()})
        except Exception as e:
            raise InputError(f"the model cannot take shapes {dict(shapes)!r}: {_reason(e)}") from None

    @staticmethod
    def _ptq(ov_model: Any, calibration: CalibrationSet | None, target: str, options: dict) -> tuple[Any, dict]:
        if calibration is None or len(calibration) == 0:
            raise InputError(
                "w8a8 (int8) quantization needs a calibration set of real inputs; pass one, or use w8a16 "
                "(weight-only, no calibration)"
            )
        import nncf

        model_type = str(options.get("model_type") or "").lower()
        if not model_type:
            softmax = any(op.get_type_name() == "Softmax" for op in ov_model.get_ops())
            model_type = "transformer" if softmax else "none"
        if model_type not in ("transformer", "none"):
            raise InputError(f"model_type must be 'transformer' or 'none', got {model_type!r}")
        samples = list(calibration)
        subset = int(options.get("subset_size") or len(samples))
        quantized = nncf.quantize(
            ov_model,
            nncf.Dataset(samples),
            subset_size=subset,
            model_type=nncf.ModelType.TRANSFORMER if model_type == "transformer" else None,
            target_device=nncf.TargetDevice.NPU if target == "npu" else nncf.TargetDevice.ANY,
        )
        return quantized, {
            "method": "nncf.quantize (post-training, static int8)",
            "calibration_samples": min(subset, len(samples)),
            "model_type": model_type,
        }

    @staticmethod
    def _compress(ov_model: Any, scheme: str, options: dict) -> tuple[Any, dict]:
        import nncf
        from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

        weights = weight_count(ov_model)
        if scheme == "w8a16":
            compressed = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_ASYM)
            return compressed, {"method": "nncf.compress_weights int8_asym", "weights": weights}
        group = int4_group_size(weights, options.get("group_size"))
        compressed = nncf.compress_weights(
            ov_model,
            mode=nncf.CompressWeightsMode.INT4_SYM,
            ratio=1.0,
            group_size=group,
            advanced_parameters=AdvancedCompressionParameters(
                group_size_fallback_mode=GroupSizeFallbackMode.ADJUST
            ),
        )
        return compressed, {"method": "nncf.compress_weights int4_sym", "group_size": group, "weights": weights}

    # --- open -------------------------------------------------------------------------------
    def open(self, artifact: Path, device: str | None, **options: Any) -> Session:
        data = self.stamp_facts(artifact)
        try:
            symbols = {spec["name"]: spec["shape"] for spec in data.get("inputs", []) + data.get("outputs", [])}
        except (TypeError, KeyError):  # a hand-edited stamp: OpenVINO's own names then
            symbols = {}
        return OpenVinoSession(artifact, device, symbols=symbols, scheme=data.get("scheme"), **options)

    # --- decoders (edgeinfer_openvino.decoder) ----------------------------------------------
    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any):
        from edgeinfer.model import cache

        from .decoder import open_decoder

        return open_decoder(model, device, context, slots, cache.area("artifacts"), dict(options))

    def convert_decoder(
        self, model: Path, scheme: str, context: int, out: Path, calibration: Sequence[str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        from edgeinfer.model import cache

        from .decoder_export import convert

        return convert(model, scheme, context, out, calibration, dict(options), cache.area("artifacts"))
