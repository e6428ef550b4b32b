"""The OpenVINO session: a model (IR or ONNX) compiled for a device and run, one feed or many pipelined."""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import OpTime, Session, TensorSpec, validate_feeds
from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import BackendError, EdgeInferError, InputError, ModelError

from .device import clean, fallback_warning, family, select_device

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("edgeinfer.openvino")

HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
PRECISIONS = {"f32": "f32", "fp32": "f32", "bf16": "bf16", "f16": "f16", "fp16": "f16"}


class DeviceFallbackWarning(RuntimeWarning):
    """The compiled model does not run on the device that was asked for (e.g. NPU → CPU)."""


def import_openvino():
    import openvino

    return openvino


def reason(e: BaseException) -> str:
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


def port_name(port: Any, i: int, prefix: str, known: Mapping[str, Any] | None = None) -> str:
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
    import numpy as np
    specs = []
    for i, p in enumerate(ports):
        name = port_name(p, i, prefix, symbols)
        pshape = p.get_partial_shape()
        names = (symbols or {}).get(name)
        if names is not None and (pshape.rank.is_dynamic or len(names) != pshape.rank.get_length()):
            names = None
        dims = _dims(pshape, names) if pshape.rank.is_static else ()
        specs.append(TensorSpec(name, dims, np.dtype(p.get_element_type().to_dtype()).name))
    return specs


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


def read_model(core: Any, path: Path) -> Any:
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
            f"{path.name} is not a readable {kind}: {reason(e)}; check the file or convert/export it again"
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
        ov = import_openvino()
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
                    read_model(self._core, path)  # raises the one-line "weights file missing" error
                check_ir_xml(path)
            try:
                self._compiled = self._core.compile_model(str(path), self.ov_device, self._config)
            except Exception as e:
                read_model(self._core, path)  # a corrupt file gets the ModelError; otherwise it is the device
                raise BackendError(f"OpenVINO could not compile {path.name} for {self.ov_device}: "
                                   f"{reason(e)}") from None
            self._model = None
        else:
            self._model = read_model(self._core, path)
            try:
                self._compiled = self._core.compile_model(self._model, self.ov_device, self._config)
            except Exception as e:
                raise BackendError(f"OpenVINO could not compile {path.name} for {self.ov_device}: "
                                   f"{reason(e)}") from None
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
        ov = import_openvino()
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
            raise BackendError(f"openvino failed to run the model: {reason(e)}") from e
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
            "openvino": import_openvino().__version__,
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
