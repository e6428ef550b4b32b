"""The ``rknn`` backend: ONNX → ``.rknn`` with rknn-toolkit2 on a PC; run on the toolkit's
simulator there, or on a Rockchip board's NPU through RKNNLite (see :mod:`.session`).

Neither toolkit is imported at module import.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract import (
    Backend,
    CalibrationSet,
    Decoders,
    Needs,
    PagingLimit,
    Placement,
    Probe,
    Problem,
    Session,
    Tensors,
    TensorSpec,
    stamp,
)
from edgeinfer.contract.backend import DeviceReading
from edgeinfer.contract.helpers import package_version
from edgeinfer.contract.native_output import native_output
from edgeinfer.contract.resources import Accelerator
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError

from . import device as hw
from . import gauges, resources, shared_weights
from .targets import (
    ARCHITECTURES,
    CONVERSION_DEFAULTS,
    DECODER_QUANT_OPTIONS,
    GET_TOOLKIT,
    QUANT_SUPPORT,
    TOOLKIT,
    supported_schemes,
)

# the toolkit wrapper, the converter and the sessions are imported by the methods that convert and open:
# `edgeinfer plan` reads only this class's declarations

DEFAULT_TARGET = "rk3588"
CONVERT_OPTIONS = {
    "target": "target platform (rk3588, rk3576, ...; default rk3588)",
    "shapes": "static input shapes, {input: [dims]}",
    "dynamic_input": "the toolkit's list of shape sets, [[shape per input], ...]",
    "quantized_algorithm": "normal | mmse | kl (int8 calibration)",
    "quantized_method": "channel | layer",
    "hybrid_fp16_layers": "ONNX node or tensor names kept in fp16 in an int8 model",
    "auto_hybrid": "let the toolkit keep layers whose int8 cosine falls below auto_hybrid_cos_thresh in fp16",
    "auto_hybrid_cos_thresh": "per-layer cosine threshold of auto_hybrid (toolkit default 0.98)",
    "disable_rules": "fusion rules to disable from the start",
    "optimization_level": "0..3 (default 3)",
}
LOAD_OPTIONS = ("core_mask",)
# decoders (edgeinfer_rknn.decoder): segments, prefill_chunk and decode_batches (the sequence counts a decode
# graph is built for) are fixed at conversion, window at load; runtime "rkllm" converts with Rockchip's RKLLM
# toolkit instead (edgeinfer_rknn.rkllm_convert)
DECODER_CONVERT_OPTIONS = ("target", "segments", "prefill_chunk", "decode_batches", "runtime", *DECODER_QUANT_OPTIONS)
DECODER_OPTIONS = ("window", "prefetch", "page_from", "scheme", "segments", "prefill_chunk", "decode_batches",
                   "target")
# what one `serve --devices` entry may be: one worker per core or core group
SERVE_CORE_MASKS = ("0", "1", "2", "0_1", "0_1_2", "auto")


#: the files beside an artifact that only the simulator reads (toolkit.sidecar, toolkit.source_model)
SIMULATION_SUFFIXES = (".src.tar", ".src.onnx", shared_weights.SUFFIX)
BOARD_ONLY = ("convert the ONNX again with edgeinfer; a bundle deployed with --board-only leaves them out: deploy it "
              "again without the flag")


class RknnBackend(Backend):
    name = "rknn"
    tensors = Tensors(
        native=(".rknn",), schemes=("fp16", "w8a8", "w8a16", "w4a16"), default_scheme="fp16",
        convert_options=tuple(CONVERT_OPTIONS), open_options=LOAD_OPTIONS,
        gaps={"dynamic_shapes": "RKNN models have static input shapes (pass shapes=..., or the toolkit's "
                                "dynamic_input list of fixed shape sets); a free batch dimension is not supported",
              "op_profile": "the rknn-toolkit2 simulator gives no per-layer times (eval_perf needs a board)"})
    decoders = Decoders(
        schemes=("fp16", "w8a8", "w4a16"),  # per target: w4a16 on rk3576 / rv1126b only
        architectures=ARCHITECTURES,  # the layer-paged export (decoder_segments); runtime rkllm: RKLLM's toolkit
        options=DECODER_OPTIONS, convert_options=DECODER_CONVERT_OPTIONS,
        native={".rkllm": "rkllm"},  # a model converted with Rockchip's RKLLM toolkit, run by librkllmrt.so
        defaults=CONVERSION_DEFAULTS,
        runtimes={"rkllm": Needs("rkllm", TOOLKIT, GET_TOOLKIT)})  # found as _toolkit() imports it
    resource_names = resources.RESOURCE_NAMES

    def accelerators(self, probe: Probe) -> list[Accelerator]:
        return resources.accelerators(probe)

    # --- facts ---------------------------------------------------------------------------------
    def mode(self) -> str:
        """"board" (rknn-toolkit-lite2 on an RK3588) or "simulator" (rknn-toolkit2 on a PC)."""
        return "board" if hw.is_board() else "simulator"

    def simulation_files(self, bundle: Path) -> list[Path]:
        """Each artifact's build inputs and source model (:func:`.toolkit.sidecar`, :func:`.toolkit.source_model`):
        the simulator rebuilds from them, a board runs the ``.rknn`` alone."""
        return sorted(f for f in bundle.rglob("*") if f.is_file() and f.name.endswith(SIMULATION_SUFFIXES))

    def paging_limit(self, device: str | None) -> PagingLimit | None:
        # Several simulator models do coexist in one process (checked with rknn-toolkit2 2.5.0: three
        # resident segments gave the same outputs), but every toolkit call holds a process-wide
        # stdout/stderr capture lock, so a background rebuild cannot overlap a running segment (and
        # would swallow the main thread's output into the toolkit log). The simulator cannot load a
        # file, so its page-in is never a board's: a rebuild from the recipe (tensor segments), or a
        # decoder segment graph taken from those this process has built (decoder.SIMULATOR_POOL).
        if (device or "").lower() == "simulator" or self.mode() == "simulator":
            return PagingLimit(None, False, "the rknn-toolkit2 simulator serialises every toolkit call behind one "
                                            "process-wide output-capture lock, so a background page-in cannot "
                                            "overlap compute; its page-in is not a board load (a rebuild from the "
                                            "recipe, or a decoder graph this process built before)")
        return None

    def placement(self, entry: str) -> Placement:
        """A ``serve --devices`` entry is an NPU core mask (0, 1, 2, 0_1, 0_1_2, auto)."""
        return Placement(options={"core_mask": entry})

    def check_device_entry(self, entry: str) -> None:
        if entry not in SERVE_CORE_MASKS:
            raise InputError(f"--devices {entry!r}: an RKNN entry is an NPU core mask, one of "
                             f"{', '.join(SERVE_CORE_MASKS)}")

    def versions(self) -> dict[str, str]:
        host, lite = package_version("rknn-toolkit2"), hw.lite_version()
        out = {"edgeinfer-rknn": package_version("edgeinfer-rknn", "?")}
        if host:
            out["rknn-toolkit2"] = host
        if lite:
            out["rknn-toolkit-lite2"] = lite
        # the toolkit that built an artifact and the runtime that loads it must share a version:
        # "rknn 2.5.0" on the PC (toolkit2) and on the board (toolkit-lite2) compare equal
        ver = (lite or host) if self.mode() == "board" else (host or lite)
        out["toolkit"] = f"rknn {ver}" if ver else "rknn missing"
        return out

    def probe(self) -> Probe:
        mode = self.mode()
        return self._probe_board() if mode == "board" else self._probe_simulator()

    def device_readings(self, devices: Sequence[str]) -> list[DeviceReading]:
        """Every NPU core's load (the driver reports all cores, whichever core masks are served)."""
        return gauges.readings()

    def _probe_simulator(self) -> Probe:
        ver = package_version("rknn-toolkit2")
        details: dict[str, Any] = {
            "mode": "simulator",
            "note": "no Rockchip board here: conversion with rknn-toolkit2, runs on its simulator (not board speed)",
            "targets": {t: list(supported_schemes(t)) for t in QUANT_SUPPORT},
        }
        if not ver:
            return Probe(False, details=details, problems=[Problem(
                "rknn-toolkit2 is not installed",
                "pip install --no-deps rknn-toolkit2==2.5.0 plus its runtime needs (see plugins/rknn/README.md)")])
        from . import toolkit as tk

        with tempfile.TemporaryDirectory(prefix="edgeinfer-rknn-probe-") as tmp:
            try:
                tk.rknn_class(Path(tmp) / "import.log")
            except BackendUnavailableError as e:
                hint = e.hint or "reinstall rknn-toolkit2"
                if "pkg_resources" in e.message:
                    hint = "pip install 'setuptools>=77,<81' (rknn-toolkit2 imports pkg_resources)"
                return Probe(False, versions={"rknn-toolkit2": ver}, details=details,
                             problems=[Problem(e.message, hint)])
        return Probe(True, versions={"rknn-toolkit2": ver}, devices=["simulator"], details=details)

    def _probe_board(self, root: Path = Path("/")) -> Probe:
        soc = hw.soc(root)
        lib = hw.runtime_library(root)
        versions = {}
        lite = hw.lite_version()
        if lite:
            versions["rknn-toolkit-lite2"] = lite
        rt = hw.runtime_version(lib)
        if rt:
            versions["librknnrt"] = rt
        drv = hw.driver_version(root)
        if drv:
            versions["npu-driver"] = drv
        problems, warnings = [], []
        if not lite:
            problems.append(Problem("rknn-toolkit-lite2 (RKNNLite) is not installed on this board",
                                    "pip install rknn-toolkit-lite2 matching the rknn-toolkit2 that converts your "
                                    "models"))
        if lib is None:
            problems.append(Problem("librknnrt.so is not installed",
                                    "copy librknnrt.so from rknn-toolkit2's rknpu2 runtime to /usr/lib"))
        gov = hw.ddr_governor(root)
        if gov is not None and gov not in hw.PINNED_GOVERNORS:
            warnings.append({
                "message": f"DDR devfreq governor is {gov!r}, not pinned: NPU speed will vary and stay below "
                           "published figures",
                "fix": f"echo performance | sudo tee /{hw.DMC_GOVERNOR}",
            })
        details = {"mode": "board", "soc": soc, "runtime_library": str(lib) if lib else None,
                   "ddr_governor": gov, "warnings": warnings, "core_masks": list(hw.CORE_MASKS)}
        return Probe(not problems, versions=versions, devices=[f"npu:{soc or 'rockchip'}"] if not problems else [],
                     problems=problems, details=details)

    def refuses_target(self, target: str, device: str | None) -> str | None:
        if self.mode() != "board" or (device or "").lower() == "simulator":
            return None
        soc = hw.soc()
        if soc and target and target != soc:
            return f"built for {target} but this board is {soc}; convert it again with target={soc!r}"
        return None

    # --- convert -------------------------------------------------------------------------------
    @native_output()
    def convert(
        self, model: Path, scheme: str, calibration: CalibrationSet | None, out: Path, **options: Any
    ) -> dict[str, Any]:
        from . import toolkit as tk
        from .convert import (
            build_with_retries,
            conversion_error,
            dynamic_sets,
            onnx_inputs,
            output_specs,
            read_onnx,
            static_inputs,
        )

        target = str(options.get("target") or DEFAULT_TARGET).lower()
        if target not in QUANT_SUPPORT:
            raise InputError(f"unknown RKNN target {target!r}; use one of: {', '.join(QUANT_SUPPORT)}")
        supported = supported_schemes(target)
        if scheme not in supported:
            raise InputError(
                f"{target} does not support {scheme} with rknn-toolkit2; it supports: {', '.join(supported)}"
                + ("" if scheme != "w4a16" else " (w4a16 needs rk3576 or rv1126b)")
            )
        algorithm = str(options.get("quantized_algorithm") or "normal").lower()
        if algorithm not in tk.ALGORITHMS:
            raise InputError(f"unknown quantized_algorithm {algorithm!r}; use normal, mmse or kl")
        method = str(options.get("quantized_method") or "channel")
        if method not in ("channel", "layer"):
            raise InputError(f"unknown quantized_method {method!r}; use channel or layer")
        quantized = scheme != "fp16"
        if quantized and calibration is None:
            raise InputError(f"rknn {scheme} needs a calibration set (--calib / calibration=CalibrationSet(...))")
        if not quantized and (options.get("hybrid_fp16_layers") or options.get("auto_hybrid")):
            raise InputError("hybrid_fp16_layers and auto_hybrid apply to quantized schemes only (w8a8, w4a16)")
        if options.get("auto_hybrid") and options.get("hybrid_fp16_layers"):
            raise InputError("use either hybrid_fp16_layers (named layers) or auto_hybrid, not both")

        proto = read_onnx(model)
        bad = tk.unsupported_ops(proto)
        if bad:
            raise ModelError(f"{model.name} uses operators rknn-toolkit2 cannot convert: {', '.join(bad)}; "
                             "replace them in the ONNX export")
        shapes = options.get("shapes")
        if options.get("dynamic_input") and not shapes:  # the first shape set is the one loaded
            first = options["dynamic_input"][0] if isinstance(options["dynamic_input"], (list, tuple)) else None
            names = [i.name for i in onnx_inputs(proto)]
            if isinstance(first, Mapping):
                shapes = dict(first)
            elif isinstance(first, (list, tuple)) and len(first) == len(names):
                shapes = dict(zip(names, first))
        inputs = static_inputs(proto, shapes, model.name)
        dyn = dynamic_sets(options["dynamic_input"], inputs) if options.get("dynamic_input") else None
        if dyn:  # the first set is the one loaded; the inputs keep those shapes
            inputs = [TensorSpec(s.name, tuple(dyn[0][k]), s.dtype) for k, s in enumerate(inputs)]
        if calibration is not None:
            calibration.check(inputs)
        recipe = tk.Recipe(
            target=target, scheme=scheme, inputs=[s.to_json() for s in inputs],
            outputs=[s.to_json() for s in output_specs(proto)], algorithm=algorithm, method=method,
            dynamic_input=dyn, hybrid_fp16=tk.hybrid_tensor_names(proto, options.get("hybrid_fp16_layers") or []),
            disable_rules=list(options.get("disable_rules") or []),
            optimization_level=int(options.get("optimization_level", 3)),
            auto_hybrid=bool(options.get("auto_hybrid", False)),
            auto_hybrid_cos_thresh=float(options.get("auto_hybrid_cos_thresh", 0.98)),
        )

        log = tk.log_path(out)
        log.unlink(missing_ok=True)
        tk.sidecar(out).unlink(missing_ok=True)
        tk.source_model(out).unlink(missing_ok=True)
        clock = tk.timed()
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        try:
            src = tmp / "src"
            src.mkdir()
            tk.copy_source(model, src / "model.onnx")
            links = shared_weights.link_beside(model, src / "model.onnx")  # a decoder graph's shared weights
            if quantized:
                recipe.calibration_samples = tk.write_calibration(calibration, inputs, src)
            rknn, retried = build_with_retries(model, proto, recipe, src, tmp, log)
            try:
                tk.export(rknn, tmp / "model.rknn", log)
            except BaseException:
                tk.release(rknn, log)
                raise
            sha = stamp.sha256_file(tmp / "model.rknn")
            recipe.artifact_sha256 = sha
            tk.write_recipe(src, recipe)
            (src / "model.onnx").replace(tmp / "src.onnx")
            for link in links:
                link.unlink()
            tk.pack(src, tmp / "src.tar")
            # the artifact appears last and whole: os.replace within one folder is atomic
            (tmp / "src.onnx").replace(tk.source_model(out))
            (tmp / "src.tar").replace(tk.sidecar(out))
            (tmp / "model.rknn").replace(out)
            if self.mode() == "simulator":
                tk.keep_built(out, sha, rknn, log)
            else:
                tk.release(rknn, log)
        except tk.BuildError as e:
            tk.sidecar(out).unlink(missing_ok=True)
            tk.source_model(out).unlink(missing_ok=True)
            raise conversion_error(model, proto, e, log) from None
        except BaseException:
            tk.sidecar(out).unlink(missing_ok=True)
            tk.source_model(out).unlink(missing_ok=True)
            out.unlink(missing_ok=True)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        facts: dict[str, Any] = {
            "target": target,
            "inputs": inputs,
            "outputs": [s for s in recipe.outputs],
            "convert_s": round(clock(), 3),
            "log": log.name,
            "build_inputs": tk.sidecar(out).name,
            "build_model": tk.source_model(out).name,
            "disabled_rules": recipe.disable_rules,
            "retried_without_rules": retried,
        }
        if quantized:
            facts.update(quantized_dtype=scheme, quantized_algorithm=tk.ALGORITHMS[algorithm],
                         quantized_method=method, calibration_samples=recipe.calibration_samples)
        if recipe.hybrid_fp16:
            facts["hybrid_fp16"] = recipe.hybrid_fp16
        if recipe.auto_hybrid:
            facts.update(auto_hybrid=True, auto_hybrid_cos_thresh=recipe.auto_hybrid_cos_thresh)
        if dyn:
            facts["dynamic_input"] = dyn
        return facts

    # --- decoders (edgeinfer_rknn.decoder, .decoder_export) -------------------------------------
    @native_output()
    def convert_decoder(self, model: Path, scheme: str, context: int, out: Path, calibration=None,
                        **options: Any) -> dict[str, Any]:
        from . import rkllm_convert
        from .decoder_export import convert_decoder

        if rkllm_convert.runtime_of(options.pop("runtime", None)) == "rkllm":
            return rkllm_convert.convert_rkllm(model, scheme, context, out, calibration, **options)
        return convert_decoder(self, model, scheme, context, out, calibration, **options)

    @native_output()
    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any):
        from .rkllm_convert import is_rkllm, rkllm_file

        if is_rkllm(Path(model)):  # a model converted with Rockchip's RKLLM toolkit (a file or deploy's directory)
            from .rkllm import open_rkllm

            return open_rkllm(rkllm_file(Path(model)), context=context, slots=slots)
        from .decoder import open_decoder

        return open_decoder(self, model, device, context, slots, **options)

    # --- open ----------------------------------------------------------------------------------
    @native_output()
    def open(self, artifact: Path, device: str | None, stamped: Mapping[str, Any], **options: Any) -> Session:
        mask_name = str(options.get("core_mask", "auto"))
        mask = hw.core_mask(mask_name)
        dev = (device or "auto").lower()
        if dev not in ("auto", "simulator", "npu", "board") and dev not in hw.SOCS:
            raise InputError(f"unknown rknn device {device!r}; use auto, simulator or npu")
        mode = self.mode()
        if dev == "simulator":
            mode = "simulator"
        elif dev != "auto" and mode != "board":
            raise BackendUnavailableError(
                f"device {device!r} needs a Rockchip board (no rockchip device tree, no librknnrt.so here)",
                "run on the board, or use device='simulator' on a PC")
        if mode == "board":
            if not stamped.get("inputs"):  # the stamp load read and checked (the module `stamp` is another thing)
                raise InputError(f"{artifact.name} has no edgeinfer stamp (input specs); convert it with edgeinfer")
            from .session import BoardSession

            return BoardSession(artifact, dict(stamped), mask, mask_name)
        return self._open_simulator(artifact)

    def _open_simulator(self, artifact: Path) -> Session:
        from . import toolkit as tk
        from .session import SimulatorSession

        side = tk.sidecar(artifact)
        if not side.exists():
            raise InputError(
                f"the rknn-toolkit2 simulator cannot run {artifact.name} by itself (it only simulates models it "
                f"builds) and its build inputs {side.name} are missing ({BOARD_ONLY}), or run the .rknn on a "
                "board"
            )
        log = tk.log_path(artifact)
        sha = stamp.sha256_file(artifact)
        clock = tk.timed()
        with tempfile.TemporaryDirectory(prefix="edgeinfer-rknn-sim-") as tmp:
            folder = Path(tmp) / "src"
            tk.unpack(side, folder)
            recipe = tk.read_recipe(folder)
            if recipe.artifact_sha256 != sha:
                raise InputError(f"{artifact.name} does not match its build inputs {side.name}; convert it again")
            rknn = tk.take_built(artifact, sha)
            rebuilt = rknn is None
            if rknn is None:
                _place_source(artifact, folder / "model.onnx")
                with open(log, "a") as f:
                    f.write("\nedgeinfer: rebuilding from the recorded recipe for the simulator\n")
                try:
                    rknn = tk.build(folder / "model.onnx", recipe, folder, log, Path(tmp))
                except tk.BuildError as e:
                    raise ModelError(f"rknn-toolkit2 could not rebuild {artifact.name} for the simulator "
                                     f"({e.stage}): {e.message}; full log: {log}") from None
        try:
            tk.init_simulator(rknn, log)
        except tk.BuildError as e:
            tk.release(rknn, log)
            raise ModelError(f"rknn simulator could not start for {artifact.name}: {e.message}; log: {log}") from None
        return SimulatorSession(rknn, recipe, log, clock() if rebuilt else 0.0)


def _place_source(artifact: Path, onnx: Path) -> None:
    """The source ONNX where the simulator's rebuild reads it: from the artifact's ``.src.onnx`` (a tar written
    before 2026-12-05 holds it itself)."""
    from . import toolkit as tk

    if onnx.exists():
        return
    source = tk.source_model(artifact)
    if not source.is_file():
        raise InputError(f"the rknn-toolkit2 simulator cannot rebuild {artifact.name}: its source model "
                         f"{source.name} is missing ({BOARD_ONLY}), or run the .rknn on a board")
    onnx.symlink_to(source.resolve())
    shared_weights.link_beside(source, onnx)
