"""The Ascend backend: PyTorch models on Ascend NPUs through torch_npu, the same code on CPU elsewhere.

Device-specific calls are all in :mod:`edgeinfer_ascend.device`; the environment doctor's parsing
and checks in :mod:`edgeinfer_ascend.doctor`; inputs and the ``.ascend`` artifact in
:mod:`edgeinfer_ascend.models`; shape buckets in :mod:`edgeinfer_ascend.buckets`.
torch / transformers / torch_npu are imported inside methods only.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import Backend, CalibrationSet, OpTime, Probe, Problem, Session, TensorSpec
from edgeinfer.contract.backend import DeviceReading
from edgeinfer.contract.helpers import first_line
from edgeinfer.contract.resources import Accelerator
from edgeinfer.errors import BackendUnavailableError, InputError

from . import buckets as bk
from . import device as dev
from . import doctor, gauges, models, resources

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
SCHEME_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "w8a16": "fp32"}
INT8_METHOD = "torchao Int8WeightOnlyConfig (weight-only INT8 per-channel, Linear layers)"
LOAD_OPTIONS = ("dtype", "compile", "compile_backend", "seq_buckets", "batch_buckets", "warmup", "threads")
CONVERT_OPTIONS = ("target",)


def _torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


class AscendBackend(Backend):
    name = "ascend"
    native_suffixes = (".ascend",)
    source_formats = ("hf", "pt2")
    schemes = ("fp32", "fp16", "bf16", "w8a16")
    decoder_schemes = ("fp16", "bf16", "fp32", "w8a16")  # fp16 first: the one dtype 310P and 910B share
    decoder_options = ("scheme", "dtype", "board", "compile", "compile_mode", "prefill_buckets", "warmup", "fused",
                       "threads", "progress")
    decoder_convert_options = ("target", "board", "dtype", "prefill_buckets")
    default_scheme = "fp32"
    gaps: dict[str, str] = {}
    convert_options = CONVERT_OPTIONS
    open_options = LOAD_OPTIONS
    resource_names = resources.RESOURCE_NAMES

    def accelerators(self, probe: Probe) -> list[Accelerator]:
        return resources.accelerators(probe)

    # --- serve placement: one card per worker process ---------------------------------------
    def placement(self, entry: str) -> tuple[dict[str, str], str | None, dict[str, Any]]:
        """A ``serve --devices`` entry N is card N: ``ASCEND_RT_VISIBLE_DEVICES=N``, device ``npu:0``."""
        if entry.isdigit():
            return {"ASCEND_RT_VISIBLE_DEVICES": entry}, "npu:0", {}
        return {}, entry, {}

    def check_device_entry(self, entry: str) -> None:
        if not (entry.isdigit() or re.fullmatch(r"npu:[0-9]+", entry)):
            raise InputError(f"--devices {entry!r}: an Ascend entry is a card index such as 0 or 1")

    # --- versions and probe ------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        torch_v = dev.installed_version("torch") or "missing"
        npu_v = dev.installed_version("torch_npu") or dev.installed_version("torch-npu")
        toolkit = f"torch {torch_v}" + (f" torch_npu {npu_v}" if npu_v else "")
        return {"edgeinfer-ascend": dev.installed_version("edgeinfer-ascend") or "?", "toolkit": toolkit}

    def device_readings(self, devices: Sequence[str]) -> list[DeviceReading]:
        """AICore load and HBM (or DDR) use of every chip npu-smi lists."""
        return gauges.readings()

    def probe(self) -> Probe:
        """The environment doctor: torch import, torch_npu, CANN toolkit, npu-smi, version table."""
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
    def convert(
        self, model: Path, scheme: str, calibration: CalibrationSet | None, out: Path, **options: Any
    ) -> dict[str, Any]:
        dev.import_torch()
        src = models.resolve(model)
        if scheme == "w8a16":
            _torchao()  # fail early, before writing anything
        if src.kind == "hf":
            manifest, files, inputs = self._convert_hf(src, scheme)
        else:
            manifest, files, inputs = self._convert_export(src, scheme)
        manifest.update(scheme=scheme, inputs=[s.to_json() for s in inputs])
        models.write_artifact(out, manifest, files)
        facts: dict[str, Any] = {"target": "torch", "inputs": inputs, "kind": src.kind}
        if scheme == "w8a16":
            facts["method"] = INT8_METHOD
        return facts

    def _convert_hf(self, src: models.Source, scheme: str):
        config = json.loads((src.path / "config.json").read_text())
        state = models.load_state_dict(src.weights)  # type: ignore[arg-type]
        module = models.build_hf(config, state)
        dtype = SCHEME_DTYPE[scheme]
        if dtype != "fp32":
            module = module.to(_torch_dtype(dtype))
        names = models.forward_inputs(module)
        inputs = [TensorSpec(n, ("batch", "seq"), "int64") for n in names]
        hidden = int(getattr(module.config, "hidden_size", 0)) or None
        outputs = [TensorSpec("last_hidden_state", ("batch", "seq", hidden), "float32")]
        manifest = {
            "kind": "hf",
            "dtype": dtype,
            "quant": INT8_METHOD if scheme == "w8a16" else None,
            "config": module.config.to_dict(),
            "outputs": [o.to_json() for o in outputs],
            "pad_token_id": int(getattr(module.config, "pad_token_id", 0) or 0),
        }
        return manifest, {"model.safetensors": models.safetensors_bytes(module.state_dict())}, inputs

    def _convert_export(self, src: models.Source, scheme: str):
        if scheme == "w8a16":
            raise InputError(
                "weight-only INT8 needs the model's Linear layers, which a torch.export program no longer has; "
                "pass the Hugging Face directory, or use scheme fp16/bf16"
            )
        data = models.export_program_bytes(src.path)
        ep = models.load_program(data)
        inputs, outputs = _export_specs(ep)
        manifest = {"kind": "export", "dtype": SCHEME_DTYPE[scheme], "quant": None,
                    "outputs": [o.to_json() for o in outputs]}
        return manifest, {"program.pt2": data}, inputs

    # --- decoders (edgeinfer_ascend.decoder) --------------------------------------------------
    def open_decoder(self, model: Path, device: str | None, context: int, slots: int, **options: Any):
        from .decoder import open_decoder

        return open_decoder(model, device, context, slots, **options)

    def convert_decoder(self, model: Path, scheme: str, context: int, out: Path, calibration=None,
                        **options: Any) -> dict[str, Any]:
        from .llm_artifact import convert_decoder

        return convert_decoder(model, scheme, context, out, calibration, **options)

    # --- open -------------------------------------------------------------------------------
    def open(self, artifact: Path, device: str | None, **options: Any) -> Session:
        dev.import_torch()
        manifest, z = models.read_artifact(artifact)
        with z:
            blobs = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
        return AscendSession(manifest, blobs, dev.pick_device(device), **options)


def _torchao():
    try:
        import logging

        logging.getLogger("torchao").setLevel(logging.ERROR)
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except Exception as e:
        raise BackendUnavailableError(
            f"weight-only INT8 needs torchao ({type(e).__name__}: {first_line(e, 120)}); "
            "pip install torchao (from a clone: pip install './plugins/ascend[int8]')"
        ) from None
    return quantize_, Int8WeightOnlyConfig


def _np_dtype(t) -> str:
    import torch

    return {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "float32", torch.int64: "int64",
            torch.int32: "int32", torch.bool: "bool", torch.float64: "float64", torch.int8: "int8",
            torch.uint8: "uint8"}.get(t, "float32")


def _export_specs(ep) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Input / output specs of a torch.export program from its placeholder metadata."""
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes}

    def spec(name: str, val) -> TensorSpec:
        shape = tuple(int(d) if str(d).lstrip("-").isdigit() else str(d) for d in val.shape)
        return TensorSpec(name, shape, _np_dtype(val.dtype))

    inputs = [spec(n, nodes[n].meta["val"]) for n in user]
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    outs = [a for a in out_node.args[0]][: len(ep.graph_signature.user_outputs)]
    outputs = [spec(f"output_{i}" if len(outs) > 1 else "output", a.meta["val"]) for i, a in enumerate(outs)]
    return inputs, outputs


class AscendSession(Session):
    def __init__(
        self,
        manifest: dict[str, Any],
        blobs: dict[str, bytes],
        device: str,
        dtype: str | None = None,
        compile: Any = False,
        compile_backend: str | None = None,
        seq_buckets: Any = None,
        batch_buckets: Any = None,
        warmup: Any = "auto",
        threads: int | None = None,
    ):
        import torch

        self._torch = torch
        self.kind = manifest["kind"]
        self.manifest = manifest
        if threads:
            torch.set_num_threads(int(threads))
        self.dtype = (dtype or manifest["dtype"]).lower()
        self.dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(self.dtype, self.dtype)
        if self.dtype not in DTYPES:
            raise InputError(f"dtype must be one of fp32, fp16, bf16, got {dtype!r}")
        dev.set_device(device)
        inputs = [TensorSpec.from_json(s) for s in manifest["inputs"]]
        outputs = [TensorSpec.from_json(s) for s in manifest["outputs"]]
        super().__init__(inputs, outputs, device=device)
        if self.kind == "hf":
            state = models.load_safetensors_bytes(blobs["model.safetensors"])
            module = models.build_hf(manifest["config"], state)
            if manifest.get("quant"):
                quantize_, config = _torchao()
                module = module.float()
                quantize_(module, config())
            self.seq_buckets = bk.parse_buckets(seq_buckets, "seq_buckets", bk.DEFAULT_SEQ_BUCKETS)
            self.batch_buckets = bk.parse_buckets(batch_buckets, "batch_buckets", bk.DEFAULT_BATCH_BUCKETS)
        else:
            module = models.load_program(blobs["program.pt2"]).module()
            self.seq_buckets, self.batch_buckets = (), ()
        if manifest.get("quant"):
            module = module.to(device)
        else:
            module = module.to(device=device, dtype=_torch_dtype(self.dtype))
        if self.kind == "hf":
            module = module.eval()  # an exported program's module has no train/eval switch
        self.module = module
        self.pad_id = int(manifest.get("pad_token_id", 0) or 0)
        self.compiled = _truthy(compile)
        default = "torchair" if dev.is_npu(device) else "inductor"
        self.compile_backend_name = compile_backend or default if self.compiled else None
        self.compiles: dict[str, int] = defaultdict(int)  # bucket key -> backend invocations
        self._current = "unbucketed"
        self._fn = self.module
        if self.compiled:
            inner = dev.compile_backend(device, compile_backend)
            if isinstance(inner, str):
                from torch._dynamo.backends.registry import lookup_backend

                inner = lookup_backend(inner)

            def counting_backend(gm, example_inputs):
                self.compiles[self._current] += 1
                return inner(gm, example_inputs)

            self._fn = torch.compile(self.module, backend=counting_backend, dynamic=False,
                                     fullgraph=self.kind == "hf")
        self.warmup_ms: dict[str, dict[str, float]] = {}
        # auto: warm up where first runs are expensive (graph compile, CANN operator compile on NPU)
        want = (self.compiled or dev.is_npu(device)) if str(warmup).lower() == "auto" else _truthy(warmup)
        self.warmup = want
        if want and self.kind == "hf" and self.seq_buckets and self.batch_buckets:
            self._warm_up()

    # --- running ----------------------------------------------------------------------------
    def _forward(self, feeds: dict[str, np.ndarray], key: str) -> list[np.ndarray]:
        torch = self._torch
        self._current = key
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in feeds.items()}
        with torch.inference_mode():
            if self.kind == "hf":
                out = self._fn(**tensors)
                results = [out.last_hidden_state]
            else:
                args = [tensors[s.name] for s in self.inputs]
                args = [a.to(_torch_dtype(self.dtype)) if a.is_floating_point() else a for a in args]
                out = self._fn(*args)
                results = list(out) if isinstance(out, (tuple, list)) else [out]
            dev.synchronize(self.device)
            return [r.detach().float().cpu().numpy() for r in results]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.outputs]
        if self.kind != "hf" or not (self.seq_buckets or self.batch_buckets):
            return dict(zip(names, self._forward(feeds, "unbucketed")))
        first = feeds[self.inputs[0].name]
        n, seq = first.shape[:2]
        parts = []
        for sl in bk.batch_chunks(n, self.batch_buckets):
            chunk = {k: v[sl] for k, v in feeds.items()}
            rows = sl.stop - sl.start
            b, s = bk.bucket_for(rows, seq, self.batch_buckets, self.seq_buckets)
            out = self._forward(bk.pad(chunk, b, s, self.pad_id), f"b{b}xs{s}")[0]
            parts.append(out[:rows, :seq])
        return {names[0]: np.concatenate(parts, axis=0)}

    def run_unpadded(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The same model on the exact feed shapes (no bucket padding): the reference for buckets."""
        names = [o.name for o in self.outputs]
        return dict(zip(names, self._forward(feeds, f"exact{tuple(next(iter(feeds.values())).shape)}")))

    def _warm_up(self) -> None:
        """Run every (batch, seq) bucket once at load; record first-run and steady-run cost."""
        names = [s.name for s in self.inputs]
        for b in self.batch_buckets:
            for s in self.seq_buckets:
                feeds = {n: np.zeros((b, s), np.int64) for n in names}
                if "input_ids" in feeds:
                    feeds["input_ids"][:] = 101
                if "attention_mask" in feeds:
                    feeds["attention_mask"][:] = 1
                key = f"b{b}xs{s}"
                t = time.perf_counter()
                self._forward(feeds, key)
                first = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                self._forward(feeds, key)
                steady = (time.perf_counter() - t) * 1e3
                self.warmup_ms[key] = {"first_run_ms": first, "second_run_ms": steady}

    def op_times(self, feeds: dict[str, np.ndarray]) -> list[OpTime]:
        rows = dev.profile_ops(self.device, lambda: self.infer(feeds))
        kind = "npu" if dev.is_npu(self.device) else self.device.split(":")[0]
        return [OpTime(name=name, op_type=name.split("::")[-1], time_ms=ms, exec_type=kind) for name, ms,
                _ in rows if ms > 0]

    def profile_notes(self) -> dict[str, Any]:
        notes: dict[str, Any] = {
            "device": self.device,
            "dtype": self.dtype,
            "kind": self.kind,
            "compile": self.compiled,
            "compile_backend": self.compile_backend_name,
            "seq_buckets": list(self.seq_buckets),
            "batch_buckets": list(self.batch_buckets),
            "warmup_ms": self.warmup_ms,
            "compiles_per_bucket": dict(self.compiles),
        }
        if self.manifest.get("quant"):
            notes["quant"] = self.manifest["quant"]
        stats = dev.allocator_stats(self.device)
        if stats:
            notes["device_memory"] = stats
        return notes

    def release(self) -> None:
        self._fn = None
        self.module = None
        dev.empty_cache(self.device)
