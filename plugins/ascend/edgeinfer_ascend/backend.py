"""The Ascend backend: PyTorch models on Ascend NPUs through torch_npu, the same code on CPU elsewhere.

Device-specific calls are all in :mod:`edgeinfer_ascend.device`; the environment doctor's parsing
and checks in :mod:`edgeinfer_ascend.doctor`; inputs and the ``.ascend`` artifact in
:mod:`edgeinfer_ascend.convert`; the session (shape buckets: :mod:`edgeinfer_ascend.buckets`) in
:mod:`edgeinfer_ascend.session`.
torch / transformers / torch_npu are imported inside methods only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import (
    Backend,
    CalibrationSet,
    Decoders,
    FreeMemory,
    Placement,
    Probe,
    Problem,
    Session,
    Tensors,
    TensorSpec,
)
from edgeinfer.contract.backend import DeviceReading
from edgeinfer.contract.native_output import native_output
from edgeinfer.contract.resources import Accelerator
from edgeinfer.errors import InputError

from . import resources
from .decoder_model import SUPPORTED

if TYPE_CHECKING:
    from . import convert

# the converter, doctor, gauges, device helpers and session are imported by the methods that use them:
# `edgeinfer plan` reads only this class's declarations

SCHEME_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "w8a16": "fp32"}
LOAD_OPTIONS = ("dtype", "compile", "compile_backend", "seq_buckets", "batch_buckets", "warmup", "threads")
CONVERT_OPTIONS = ("target",)


class AscendBackend(Backend):
    name = "ascend"
    tensors = Tensors(native=(".ascend",), sources=("hf", "pt2"), schemes=("fp32", "fp16", "bf16", "w8a16"),
                      convert_options=CONVERT_OPTIONS, open_options=LOAD_OPTIONS)
    decoders = Decoders(
        schemes=("fp16", "bf16", "fp32", "w8a16"),  # fp16 first: the one dtype 310P and 910B share
        architectures=SUPPORTED,  # what decoder_model's static-cache forward reproduces
        options=("scheme", "dtype", "compile", "compile_mode", "prefill_buckets", "warmup", "fused",
                 "threads", "progress"),
        convert_options=("target", "dtype", "prefill_buckets", "group_size"),
        closer={"group_size": "smaller blocks: --option group_size=N (N below the default)"})
    resource_names = resources.RESOURCE_NAMES

    def accelerators(self, probe: Probe) -> list[Accelerator]:
        return resources.accelerators(probe)

    # --- serve placement: one card per worker process ---------------------------------------
    def placement(self, entry: str) -> Placement:
        """A ``serve --devices`` entry N is card N: ``ASCEND_RT_VISIBLE_DEVICES=N``, device ``npu:0``."""
        if entry.isdigit():
            return Placement(env={"ASCEND_RT_VISIBLE_DEVICES": entry}, device="npu:0")
        return Placement(device=entry)

    def check_device_entry(self, entry: str) -> None:
        if not (entry.isdigit() or re.fullmatch(r"npu:[0-9]+", entry)):
            raise InputError(f"--devices {entry!r}: an Ascend entry is a card index such as 0 or 1")

    # --- versions and probe ------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        from . import device as dev

        torch_v = dev.installed_version("torch") or "missing"
        npu_v = dev.installed_version("torch_npu") or dev.installed_version("torch-npu")
        toolkit = f"torch {torch_v}" + (f" torch_npu {npu_v}" if npu_v else "")
        return {"edgeinfer-ascend": dev.installed_version("edgeinfer-ascend") or "?", "toolkit": toolkit}

    def device_readings(self, devices: Sequence[str]) -> list[DeviceReading]:
        """AICore load and HBM (or DDR) use of every chip npu-smi lists."""
        from . import gauges

        return gauges.readings()

    def probe(self) -> Probe:
        """The environment doctor: torch import, torch_npu, CANN toolkit, npu-smi, version table."""
        from . import device as dev
        from . import doctor

        problems: list[Problem] = []
        details: dict[str, Any] = {}
        versions: dict[str, str] = {}
        torch_v = dev.installed_version("torch")
        npu_v = dev.installed_version("torch_npu") or dev.installed_version("torch-npu")
        if torch_v:
            versions["torch"] = torch_v
        if npu_v:
            versions["torch_npu"] = npu_v
        check = dev.torch_import_check()
        tk = doctor.find_toolkit()
        details["cann_toolkit"] = tk.to_json()
        if tk.version:
            versions["cann"] = tk.version
        smi_text, smi_why = dev.run_npu_smi()
        info = doctor.parse_npu_smi_info(smi_text) if smi_text is not None else None
        if info is not None:
            details["npu_smi"] = info.to_json()
            if info.version:
                versions["npu-smi"] = info.version
            problems += doctor.npu_smi_problems(info)
        else:
            details["npu_smi"] = smi_why
        ascend_present = bool(npu_v or tk.home or smi_text is not None)
        if not check.ok and check.ran:
            problems += doctor.import_problems(check.stderr, tk.home)
        problems += doctor.toolkit_problems(tk, npu_present=bool(info and info.chips) or bool(npu_v))
        cann_v = check.versions.get("cann") or tk.version
        problems += doctor.version_problems(torch_v, npu_v, cann_v)
        details["compat"] = {
            "status": doctor.compat_status(npu_v, cann_v),
            "table": doctor.compat_table()["source_url"],
        }
        devices: list[str] = []
        if check.versions.get("npu_available"):
            devices += [f"npu:{i}" for i in range(int(check.versions.get("npu_count", 0)))]
            details["mode"] = "npu"
        elif ascend_present:
            details["mode"] = "cpu (Ascend software found but no usable NPU: see problems)"
        else:
            details["mode"] = "cpu (no Ascend NPU, CANN or torch_npu on this machine)"
        if torch_v is None:
            problems.append(Problem("torch is not installed", "pip install torch (and torch_npu on an Ascend host)"))
            return Probe(available=False, versions=versions, devices=[], problems=problems, details=details)
        devices.append("cpu")
        return Probe(available=True, versions=versions, devices=devices, problems=problems, details=details)

    # --- convert ----------------------------------------------------------------------------
    @native_output()
    def convert(
        self, model: Path, scheme: str, calibration: CalibrationSet | None, out: Path, **options: Any
    ) -> dict[str, Any]:
        from . import convert
        from . import device as dev
        from .convert import INT8_METHOD, torchao

        dev.import_torch()
        src = convert.resolve(model)
        if scheme == "w8a16":
            torchao()  # fail early, before writing anything
        if src.kind == "hf":
            manifest, files, inputs = self._convert_hf(src, scheme)
        else:
            manifest, files, inputs = self._convert_export(src, scheme)
        manifest.update(scheme=scheme, inputs=[s.to_json() for s in inputs])
        convert.write_artifact(out, manifest, files)
        facts: dict[str, Any] = {"target": "torch", "inputs": inputs, "kind": src.kind}
        if scheme == "w8a16":
            facts["method"] = INT8_METHOD
        return facts

    def _convert_hf(self, src: convert.Source, scheme: str):
        from . import convert
        from .convert import INT8_METHOD
        from .session import torch_dtype

        config = json.loads((src.path / "config.json").read_text())
        state = convert.load_state_dict(src.weights)  # type: ignore[arg-type]
        module = convert.build_hf(config, state)
        dtype = SCHEME_DTYPE[scheme]
        if dtype != "fp32":
            module = module.to(torch_dtype(dtype))
        names = convert.forward_inputs(module)
        inputs = [TensorSpec(n, ("batch", "seq"), "int64") for n in names]
        hidden = int(getattr(module.config, "hidden_size", 0)) or None
        outputs = [TensorSpec("last_hidden_state", ("batch", "seq", hidden), "float32")]
        if convert.is_classifier(config):
            outputs = [TensorSpec("logits", ("batch", int(module.config.num_labels)), "float32")]
        manifest = {
            "kind": "hf",
            "dtype": dtype,
            "quant": INT8_METHOD if scheme == "w8a16" else None,
            "config": module.config.to_dict(),
            "outputs": [o.to_json() for o in outputs],
            "pad_token_id": int(getattr(module.config, "pad_token_id", 0) or 0),
        }
        return manifest, {"model.safetensors": convert.safetensors_bytes(module.state_dict())}, inputs

    def _convert_export(self, src: convert.Source, scheme: str):
        if scheme == "w8a16":
            raise InputError(
                "weight-only INT8 needs the model's Linear layers, which a torch.export program no longer has; "
                "pass the Hugging Face directory, or use scheme fp16/bf16"
            )
        from . import convert
        from .convert import export_specs

        data = convert.export_program_bytes(src.path)
        ep = convert.load_program(data)
        inputs, outputs = export_specs(ep)
        manifest = {"kind": "export", "dtype": SCHEME_DTYPE[scheme], "quant": None,
                    "outputs": [o.to_json() for o in outputs]}
        return manifest, {"program.pt2": data}, inputs

    # --- decoders (edgeinfer_ascend.decoder) --------------------------------------------------
    @native_output()
    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any):
        from .decoder import open_decoder

        return open_decoder(model, device, context, slots, **options)

    def free_memory(self, device: str | None) -> FreeMemory | None:
        """npu-smi's free memory on the chip behind ``device`` (``ASCEND_RT_VISIBLE_DEVICES`` respected); None
        off the NPU or without npu-smi (the doctor reports that)."""
        from . import device as dev
        from . import doctor

        where = device.strip().lower() if device and dev.is_npu(device.strip().lower()) else dev.pick_device(device)
        if not dev.is_npu(where):
            return None
        text, _why = dev.run_npu_smi()
        return None if text is None else doctor.free_memory(doctor.parse_npu_smi_info(text), dev.device_index(where))

    @native_output()
    def convert_decoder(self, model: Path, scheme: str, context: int, out: Path, calibration=None,
                        **options: Any) -> dict[str, Any]:
        from .decoder_export import convert_decoder

        return convert_decoder(model, scheme, context, out, calibration, **options)

    # --- open -------------------------------------------------------------------------------
    @native_output()
    def open(self, artifact: Path, device: str | None, stamp: dict[str, Any], **options: Any) -> Session:
        from . import convert
        from . import device as dev
        from .session import AscendSession

        dev.import_torch()
        manifest, z = convert.read_artifact(artifact)
        with z:
            blobs = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
        return AscendSession(manifest, blobs, dev.pick_device(device), **options)
