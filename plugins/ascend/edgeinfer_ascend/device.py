"""Every device-specific call of the Ascend backend lives here, and only here.

torch_npu import, ``torch.npu.*``, ``npu-smi``, the TorchAir compile backend, the NPU profiler
and the NPU allocator statistics. Everything else in the plugin runs the same code on whichever
torch device :func:`pick_device` returns (``npu:N`` when torch_npu works, else ``cuda``/``cpu``).

torch_npu is dangerous to import: where CANN is missing, torch's device-backend auto-loading makes
``import torch`` itself raise. So before this process imports torch, :func:`torch_import_check`
imports it in a *subprocess*; when that fails because of torch_npu, :func:`import_torch` sets
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` first so the CPU path still works, and the doctor reports why.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

NPU_SMI = "npu-smi"

_CHECK = r"""
import json, sys
out = {}
try:
    import torch
    out["torch"] = torch.__version__
except BaseException as e:
    sys.stderr.write("import torch failed\n")
    raise
try:
    import torch_npu
    out["torch_npu"] = getattr(torch_npu, "__version__", "?")
    out["npu_available"] = bool(torch.npu.is_available())
    out["npu_count"] = int(torch.npu.device_count()) if out["npu_available"] else 0
    try:
        out["cann"] = torch_npu.npu.utils.get_cann_version()
    except Exception:
        pass
except ModuleNotFoundError:
    pass
print(json.dumps(out))
"""


@dataclass
class TorchCheck:
    ok: bool  # `import torch` works with the default environment
    versions: dict[str, Any] = field(default_factory=dict)
    stderr: str = ""
    ran: bool = False  # a subprocess was needed (torch_npu installed)


def torch_npu_installed() -> bool:
    """Whether a torch_npu distribution is importable-looking, without importing anything."""
    return importlib.util.find_spec("torch_npu") is not None


@lru_cache(maxsize=1)
def torch_import_check(timeout: float = 120.0) -> TorchCheck:
    """Can this interpreter ``import torch`` (and torch_npu) with the default environment?

    Without torch_npu installed the answer needs no subprocess. With it, ``import torch`` is tried
    in a child process so that a broken torch_npu can never break this one.
    """
    if not torch_npu_installed():
        return TorchCheck(ok=importlib.util.find_spec("torch") is not None)
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return TorchCheck(ok=False, stderr=f"import torch took more than {timeout:.0f} s", ran=True)
    versions: dict[str, Any] = {}
    if proc.returncode == 0:
        try:
            versions = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
    return TorchCheck(ok=proc.returncode == 0, versions=versions, stderr=proc.stderr, ran=True)


def import_torch():
    """Import torch in this process so that a broken torch_npu cannot make it fail."""
    import logging

    # transformers imports torchao when it is installed; its optional CUDA kernels log load failures
    logging.getLogger("torchao").setLevel(logging.ERROR)
    if "torch" not in sys.modules and torch_npu_installed() and not torch_import_check().ok:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch

    return torch


@lru_cache(maxsize=1)
def npu_runtime() -> Any | None:
    """The torch_npu module when it imports and sees at least one NPU, else None."""
    if not torch_npu_installed() or not torch_import_check().ok:
        return None
    import_torch()
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)

        return torch_npu if torch.npu.is_available() and torch.npu.device_count() > 0 else None
    except Exception:
        return None


def pick_device(device: str | None) -> str:
    """Map a user device (None/"auto"/"npu"/"npu:1"/"cpu"/"cuda") to a torch device string.

    ``ASCEND_RT_VISIBLE_DEVICES`` is honoured by CANN itself: with it set to ``3``, the only card
    this process sees is ``npu:0``. One process per card is the deployment model.
    """
    from edgeinfer.errors import BackendUnavailableError, InputError

    d = (device or "auto").strip().lower()
    if d in ("auto", ""):
        if npu_runtime() is not None:
            return "npu:0"
        torch = import_torch()
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if d.startswith("npu"):
        idx = d.partition(":")[2] or "0"
        if not idx.isdigit():
            raise InputError(f"bad device {device!r}; use npu, npu:N, cpu or cuda")
        if not torch_npu_installed():
            raise BackendUnavailableError(
                f"device {device!r} needs the Python package 'torch_npu', which is not installed",
                "install the torch_npu release that matches your CANN and torch (plugins/ascend/README.md), "
                "or omit --device to run on cpu", kind="package_missing")
        if npu_runtime() is None:
            raise BackendUnavailableError(
                f"device {device!r} asked for but torch_npu has no usable NPU here; run `edgeinfer doctor` "
                "(or omit --device to run on cpu)"
            )
        import torch

        n = torch.npu.device_count()
        if int(idx) >= n:
            vis = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
            raise InputError(
                f"device npu:{idx} does not exist: {n} NPU(s) visible"
                + (f" (ASCEND_RT_VISIBLE_DEVICES={vis} renumbers them from 0)" if vis else "")
            )
        return f"npu:{idx}"
    if d == "cpu":
        return "cpu"
    if d.startswith("cuda"):
        torch = import_torch()
        if not torch.cuda.is_available():
            raise BackendUnavailableError(f"device {device!r} asked for but torch sees no CUDA device; use cpu")
        return d if ":" in d else "cuda:0"
    raise InputError(f"unknown device {device!r} for the ascend backend; use npu, npu:N, cpu or cuda")


def is_npu(device: str) -> bool:
    return device.startswith("npu")


def device_index(device: str) -> int:
    """The position of ``device`` among the chips npu-smi lists: ``ASCEND_RT_VISIBLE_DEVICES=3`` makes
    the only visible card ``npu:0``."""
    idx = int(device.partition(":")[2] or 0)
    visible = [v.strip() for v in os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return int(visible[idx]) if idx < len(visible) and visible[idx].isdigit() else idx


def set_device(device: str) -> None:
    if is_npu(device):
        import torch

        torch.npu.set_device(device)


def synchronize(device: str) -> None:
    import torch

    if is_npu(device):
        torch.npu.synchronize()
    elif device.startswith("cuda"):
        torch.cuda.synchronize()


def compile_backend(device: str, requested: str | None = None, mode: str | None = None) -> Any:
    """TorchAir's NPU backend on Ascend; torch's default compiler (or ``requested``) elsewhere.

    ``mode="reduce-overhead"`` asks TorchAir for aclgraph capture/replay (Atlas A2/A3) and, where the
    installed TorchAir has the switch, static-shape kernels compiled for each captured shape (TorchAir
    user guide: "reduce-overhead模式配置", "静态Kernel编译配置", hiascend.com Pytorch 7.x docs).
    """
    if requested:
        return requested
    if is_npu(device):
        import torchair  # shipped with torch_npu

        config = torchair.CompilerConfig()
        experimental = getattr(config, "experimental_config", None)
        if experimental is not None and hasattr(experimental, "frozen_parameter"):
            experimental.frozen_parameter = True  # weights never change during inference
        if mode:
            config.mode = mode
            aclgraph = getattr(experimental, "aclgraph", None)
            if mode == "reduce-overhead" and hasattr(aclgraph, "_aclnn_static_shape_kernel"):
                aclgraph._aclnn_static_shape_kernel = True
        return torchair.get_npu_backend(compiler_config=config)
    return "inductor"


def soc_name(device: str) -> str:
    """The chip's name as torch_npu reports it ("Ascend910B4", "Ascend310P3"); "" off the NPU."""
    if not is_npu(device):
        return ""
    import torch

    return str(torch.npu.get_device_name(device))


class NpuFusedOps:
    """The decoder's fused operators on the NPU (the interface of
    :class:`edgeinfer_ascend.decoder_model.ReferenceOps`).

    Signatures from the Ascend Extension for PyTorch API reference (hiascend.com, Pytorch 7.0.0
    apilist): ``npu_rms_norm(x, gamma, epsilon) -> (y, rstd)``; ``npu_rotary_mul(x, r1, r2)`` in "half"
    mode, x BSND with r1 / r2 BS1D; ``npu_fused_infer_attention_score(q, k, v, *, atten_mask, num_heads,
    scale, input_layout, num_key_value_heads) -> (out, lse)`` with ``atten_mask`` True where a position is
    *not* attended. The fused attention kernel is documented for Atlas A2/A3 (910B and later); on other
    chips (310P) attention stays on the reference math and only the norm and rotary kernels are fused.
    """

    fused = True

    def __init__(self, torch_npu: Any, attention: bool):
        self.npu = torch_npu
        self.fused_attention = attention
        self.name = ("fused Ascend operators (npu_rms_norm, npu_rotary_mul"
                     + (", npu_fused_infer_attention_score)" if attention else "; attention: SDPA)"))

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        return self.npu.npu_rms_norm(x, weight, epsilon=eps)[0]

    def rotary(self, x: Any, cos: Any, sin: Any) -> Any:
        return self.npu.npu_rotary_mul(x, cos, sin)

    def attention(self, q: Any, k: Any, v: Any, mask: Any, scale: float) -> Any:
        if not self.fused_attention:
            from .decoder_model import ReferenceOps

            return ReferenceOps().attention(q, k, v, mask, scale)
        out, _ = self.npu.npu_fused_infer_attention_score(
            q, k, v, atten_mask=~mask, num_heads=q.shape[2], num_key_value_heads=k.shape[2],
            input_layout="BSND", scale=scale,
        )
        return out


def npu_fused_ops(device: str) -> NpuFusedOps | None:
    """The fused operators where ``device`` is an NPU with torch_npu, else None."""
    if not is_npu(device):
        return None
    torch_npu = npu_runtime()
    if torch_npu is None or not hasattr(torch_npu, "npu_rms_norm"):
        return None
    attention = hasattr(torch_npu, "npu_fused_infer_attention_score") and soc_name(device).startswith(
        ("Ascend910", "Ascend950"))
    return NpuFusedOps(torch_npu, attention)


def allocator_stats(device: str) -> dict[str, int]:
    """Peak / current bytes from the device allocator (NPU or CUDA); empty on CPU."""
    import torch

    if is_npu(device):
        return {
            "allocated_bytes": int(torch.npu.memory_allocated(device)),
            "max_allocated_bytes": int(torch.npu.max_memory_allocated(device)),
            "reserved_bytes": int(torch.npu.memory_reserved(device)),
        }
    if device.startswith("cuda"):
        return {
            "allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "reserved_bytes": int(torch.cuda.memory_reserved(device)),
        }
    return {}


def profile_ops(device: str, fn: Callable[[], Any]) -> list[tuple[str, float, int]]:
    """Run ``fn`` once under the device's profiler; return (op name, self time ms, calls).

    Ascend: ``torch_npu.profiler`` with NPU activities (device time per op); elsewhere
    ``torch.profiler`` with CPU (and CUDA) activities.
    """
    import torch

    if is_npu(device):
        import tempfile

        import torch_npu

        with tempfile.TemporaryDirectory(prefix="edgeinfer-npu-prof-") as tmp:
            acts = [torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU]
            with torch_npu.profiler.profile(
                activities=acts, on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(tmp)
            ) as prof:
                fn()
                torch.npu.synchronize()
            events = prof.key_averages()
            return [
                (e.key, float(getattr(e, "self_device_time_total", 0) or e.self_cpu_time_total) / 1e3, int(e.count))
                for e in events
            ]
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        synchronize(device)
    return [(e.key, float(e.self_cpu_time_total) / 1e3, int(e.count)) for e in prof.key_averages()]


def run_npu_smi(timeout: float = 15.0) -> tuple[str | None, str]:
    """``npu-smi info`` stdout, or (None, why) when the tool is absent or fails."""
    exe = shutil.which(NPU_SMI)
    if exe is None:
        return None, "npu-smi not found on PATH (no Ascend driver installed)"
    try:
        proc = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"npu-smi info failed: {e}"
    if proc.returncode != 0:
        return None, f"npu-smi info exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}"
    return proc.stdout, ""


def installed_version(dist: str) -> str | None:
    from edgeinfer.contract.helpers import package_version

    return package_version(dist)


def empty_cache(device: str) -> None:
    """Return cached device memory to the driver after a session closes."""
    import sys as _sys

    torch = _sys.modules.get("torch")
    if torch is None:
        return
    if is_npu(device):
        torch.npu.empty_cache()
    elif device.startswith("cuda"):
        torch.cuda.empty_cache()
