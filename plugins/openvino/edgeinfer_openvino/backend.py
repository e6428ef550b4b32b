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

The conversion helpers are in :mod:`.convert`, the session in :mod:`.session`, device choice and
probing in :mod:`.device`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract import Backend, CalibrationSet, Decoders, Probe, Problem, Session, Tensors
from edgeinfer.contract.backend import DeviceReading
from edgeinfer.contract.helpers import package_version
from edgeinfer.contract.native_output import native_output
from edgeinfer.contract.resources import Accelerator
from edgeinfer.contract.stamp import refuses_newer
from edgeinfer.errors import InputError

from . import decoder_config, decoder_export, int8_blocks, resources

# the converter, device helpers and session are imported by the methods that use them: `edgeinfer plan` reads
# only this class's declarations

CONVERT_OPTIONS = ("board", "group_size", "model_type", "shapes", "subset_size", "target")
OPEN_OPTIONS = ("cache_dir", "config", "hint", "num_requests", "precision", "threads")


class OpenVinoBackend(Backend):
    name = "openvino"
    tensors = Tensors(native=(".xml",),
                      schemes=("fp32", "fp16", "w8a8", "w8a16", "w4a16", "w4a16_g32", "w4a16_g64", "w4a16_g128"),
                      convert_options=CONVERT_OPTIONS, open_options=OPEN_OPTIONS)
    decoders = Decoders(
        schemes=("fp16", "fp32", "w8a16", "w4a16"),  # decoder_export.SCHEMES; fp16 first: lossless on CPU
        architectures=decoder_export.ARCHITECTURES, options=decoder_config.OPTIONS,
        convert_options=decoder_export.CONVERT_OPTIONS,
        runtimes=dict.fromkeys(decoder_export.RUNTIME_TARGETS),  # openvino-gpu / -cpu: the IR for that device
        builds={"openvino-cpu": None},  # the CPU build on any board that lists it (the host's x86 cores too)
        defaults={"w8a16_cpu_block": int8_blocks.BLOCK},  # a changed block is another conversion
        closer={"group_size": "smaller blocks: --option group_size=N (N below the default)"},
        logits_options={"loop": "steps"},  # the golden check steps the IR through ov.Core (GenAI gives no logits)
        extras=("decoders",))  # GenAI's loops (openvino-genai, openvino-tokenizers): not in a board's encoder install
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

    def refuses_toolkit(self, made: str, have: str) -> str | None:
        # OpenVINO reads the IRs of its earlier releases (OpenVINO's own IR model cards on Hugging Face say
        # "compatible with OpenVINO version X and higher"; here a MiniLM bundle and the tiny decoder's fp16 and w8a16
        # bundles converted with 2026.3.1 passed their golden checks on 2026.4.1, docs/openvino.md)
        return refuses_newer(made, have)

    def device_readings(self, devices: Sequence[str]) -> list[DeviceReading]:
        """NPU and GPU memory as OpenVINO reports it (no utilisation: OpenVINO has no such property)."""
        from . import gauges

        return gauges.readings()

    def probe(self) -> Probe:
        from .device import accel_nodes, cpu_model_name, diagnose, npu_details, read_text
        from .session import import_openvino, reason

        cpu = cpu_model_name(read_text("/proc/cpuinfo"))
        try:
            ov = import_openvino()
            core = ov.Core()
            devices = list(core.available_devices)
        except Exception as e:
            return Probe(
                available=False,
                problems=[Problem(f"openvino does not import or start: {reason(e)}", "pip install -U openvino")],
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
        problems = diagnose(cpu, devices, accel_nodes())
        versions = {"openvino": ov.__version__}
        nncf = package_version("nncf")
        if nncf:
            versions["nncf"] = nncf
        else:
            problems.append(Problem("nncf is not installed: int8/w8a16/w4a16 conversion is unavailable",
                                    "pip install './plugins/openvino[convert]' (or: pip install nncf)"))
        if not package_version("openvino-genai"):
            problems.append(Problem("openvino-genai is not installed: decoder bundles (generate, chat, serve) cannot "
                                    "run", "pip install './plugins/openvino[decoders]'"))
        return Probe(available=bool(devices), versions=versions, devices=devices, problems=problems, details=details)

    def refuses_target(self, target: str, device: str | None) -> str | None:
        from .device import requested_primary

        if target == "dynamic" and device and requested_primary(device) == "NPU":
            return (
                "this IR has dynamic input shapes, which the NPU cannot compile; convert it again with static "
                "shapes (target='npu', shapes={'input_ids': [1, 128], ...})"
            )
        return None

    # --- convert ----------------------------------------------------------------------------
    @native_output()
    def convert(
        self, model: Path, scheme: str, calibration: CalibrationSet | None, out: Path, **options: Any
    ) -> dict[str, Any]:
        from .session import import_openvino

        ov = import_openvino()
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
        from .convert import compress, onnx_dim_names, ptq, reshape
        from .session import port_name, port_specs, read_model

        core = ov.Core()
        ov_model = read_model(core, model)
        symbols = onnx_dim_names(model)
        target = str(options.get("target") or "").lower()
        shapes = options.get("shapes")
        if shapes:
            reshape(ov, ov_model, shapes)
        static = all(p.get_partial_shape().is_static for p in ov_model.inputs)
        if target == "npu" and not static:
            dyn = [port_name(p, i, "input") for i,
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
            ov_model, facts = ptq(ov_model, calibration, target, options)
        elif scheme in ("w8a16", "w4a16") or scheme.startswith("w4a16_g"):
            if scheme.startswith("w4a16_g"):  # the group size is part of the scheme name
                if options.get("group_size") not in (None, int(scheme.split("_g")[1])):
                    raise InputError(f"scheme {scheme} fixes the group size; drop group_size={options['group_size']}")
                options = dict(options, group_size=int(scheme.split("_g")[1]))
            ov_model, facts = compress(ov_model, scheme.split("_g")[0], options)
        ov.save_model(ov_model, str(out), compress_to_fp16=compress_fp16)
        facts.update(
            target=target or ("any" if static else "dynamic"),
            inputs=inputs,
            outputs=[s.to_json() for s in port_specs(ov_model.outputs, "output", symbols)],
            **({"shapes": {k: list(v) for k, v in shapes.items()}} if shapes else {}),
        )
        return facts

    # --- open -------------------------------------------------------------------------------
    @native_output()
    def open(self, artifact: Path, device: str | None, stamp: dict[str, Any], **options: Any) -> Session:
        try:
            symbols = {spec["name"]: spec["shape"] for spec in stamp.get("inputs", []) + stamp.get("outputs", [])}
        except (TypeError, KeyError):  # a hand-edited stamp: OpenVINO's own names then
            symbols = {}
        from .session import OpenVinoSession

        return OpenVinoSession(artifact, device, symbols=symbols, scheme=stamp.get("scheme"), **options)

    # --- decoders (edgeinfer_openvino.decoder) ----------------------------------------------
    @native_output()
    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any):
        from edgeinfer.contract import cache

        from .decoder import open_decoder

        return open_decoder(model, device, context, slots, cache.area("artifacts"), dict(options))

    @native_output()
    def convert_decoder(
        self, model: Path, scheme: str, context: int, out: Path, calibration: Sequence[str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        from edgeinfer.contract import cache

        from .decoder_export import convert

        facts = convert(model, scheme, context, out, calibration, dict(options), cache.area("artifacts"))
        # the export's versions and this backend's, whose "toolkit" the stamp check compares at load
        return {**facts, "versions": {**facts["versions"], **self.versions()}}
