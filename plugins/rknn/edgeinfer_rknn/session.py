"""Running a ``.rknn``: the toolkit's simulator on a PC, or the NPU of a Rockchip board through RKNNLite.

The board side is the only code that talks to RKNNLite. It is written against RKNNLite's documented
API: ``RKNNLite()``, ``load_rknn(path)``, ``init_runtime(core_mask=...)``,
``inference(inputs=[...], data_format=...)``, ``get_sdk_version()``, ``release()`` and, where
the installed version has them, ``eval_perf()`` / ``eval_memory()`` (with ``perf_debug`` /
``eval_mem`` passed to ``init_runtime``). No board is attached to the development machines,
so the board path is exercised only on a board.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import OpTime, Session, TensorSpec
from edgeinfer.contract.packages import import_runtime
from edgeinfer.errors import FeedError, InputError

from . import toolkit as tk

if TYPE_CHECKING:
    import numpy as np


class RknnSession(Session):
    """Inputs in, outputs out; the runtime (simulator or RKNNLite) hides behind ``_run``."""

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec], device: str, log: Path):
        super().__init__(inputs, outputs, device=device)
        self._log = log

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    shape_sets: list[list[list[int]]] | None = None  # dynamic_input: the only shapes the model takes

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import numpy as np
        arrays = [np.ascontiguousarray(feeds[s.name]) for s in self.inputs]
        if self.shape_sets and [list(a.shape) for a in arrays] not in self.shape_sets:
            got = ", ".join(f"{s.name} {list(a.shape)}" for s, a in zip(self.inputs, arrays))
            raise FeedError(f"input shapes {got} are not among the model's dynamic_input shape sets "
                            f"{self.shape_sets}; feed one of those")
        outs = self._run(arrays)
        result = {}
        for spec, out in zip(self.outputs, outs):
            out = np.asarray(out)
            want = np.dtype(spec.dtype)
            if out.dtype != want:  # the runtime hands back float32 for every output
                out = np.rint(out).astype(want) if want.kind in "iub" else out.astype(want)
            result[spec.name] = out
        return result


class SimulatorSession(RknnSession):
    """The toolkit's simulator on a PC: the model rebuilt from the recipe kept next to the artifact."""

    def __init__(self, rknn: Any, recipe: tk.Recipe, log: Path, rebuild_s: float):
        inputs = [TensorSpec.from_json(s) for s in recipe.inputs]
        if recipe.dynamic_input:  # dims that differ between shape sets are free
            inputs = [
                TensorSpec(s.name, tuple(d if len({st[k][a] for st in recipe.dynamic_input}) == 1 else None
                                         for a, d in enumerate(s.shape)), s.dtype)
                for k, s in enumerate(inputs)
            ]
        super().__init__(inputs, [TensorSpec.from_json(s) for s in recipe.outputs], "simulator", log)
        self._rknn = rknn
        self._rebuild_s = rebuild_s
        self.shape_sets = recipe.dynamic_input

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        try:
            return tk.infer(self._rknn, arrays, self._log)
        except tk.BuildError as e:
            raise RuntimeError(f"simulator {e}; full log: {self._log}") from None

    def profile_notes(self) -> dict[str, Any]:
        return {"simulator": True, "note": "simulator figures, not board speed", "rebuild_s": round(self._rebuild_s,
                                                                                                    3)}

    def release(self) -> None:
        if self._rknn is not None:
            tk.release(self._rknn, self._log)
            self._rknn = None


class BoardSession(RknnSession):
    """The NPU of a Rockchip board through RKNNLite."""

    def __init__(self, artifact: Path, data: Mapping[str, Any], mask: int, mask_name: str):
        inputs = [TensorSpec.from_json(s) for s in data.get("inputs", [])]
        outputs = [TensorSpec.from_json(s) for s in data.get("outputs", [])]
        super().__init__(inputs, outputs, f"npu:{data.get('target', '')}", tk.log_path(artifact))
        self._artifact, self._mask, self._mask_name = artifact, mask, mask_name
        self._rt = LiteRuntime(artifact, mask)
        self._memory: int | None = None

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return self._rt.inference(arrays)

    def op_times(self, feeds: dict[str, np.ndarray]) -> list[OpTime]:
        """Per-layer times from ``eval_perf`` and memory from ``eval_memory`` (a second runtime
        with perf_debug/eval_mem: both slow inference down, so the latency runs do without)."""
        import numpy as np
        rt = LiteRuntime(self._artifact, self._mask, perf=True)
        try:
            rt.inference([np.ascontiguousarray(feeds[s.name]) for s in self.inputs])
            perf = rt.eval_perf()
            self._memory = parse_memory(rt.eval_memory())
        finally:
            rt.release()
        if perf is None:
            return []
        return [OpTime(name=n, op_type=t, time_ms=ms, exec_type=target) for n, t, ms,
                target in parse_perf_table(perf)]

    def profile_notes(self) -> dict[str, Any]:
        notes: dict[str, Any] = {"simulator": False, "core_mask": self._mask_name, "sdk": self._rt.sdk_version()}
        if self._memory is not None:
            notes["npu_memory_bytes"] = self._memory
        return notes

    def release(self) -> None:
        self._rt.release()


class LiteRuntime:
    """One .rknn model loaded on the board's NPU through RKNNLite."""

    def __init__(self, artifact: Path, mask: int, perf: bool = False):
        lite = import_runtime("rknnlite.api", "rknn-toolkit-lite2", "running a .rknn on the board's NPU (RKNNLite)")
        self._lite = lite.RKNNLite(verbose=False)
        if self._lite.load_rknn(str(artifact)) != 0:
            self._lite.release()
            raise InputError(f"RKNNLite could not load {artifact.name}; convert it again for this board")
        params = inspect.signature(self._lite.init_runtime).parameters
        kwargs: dict[str, Any] = {"core_mask": mask}
        self.perf = perf and "perf_debug" in params
        if self.perf:
            kwargs["perf_debug"] = True
            if "eval_mem" in params:
                kwargs["eval_mem"] = True
        if self._lite.init_runtime(**kwargs) != 0:
            self._lite.release()
            raise InputError(
                f"RKNNLite could not start the NPU runtime for {artifact.name} (core_mask {mask:#x}); "
                "check that librknnrt.so matches the toolkit version that built the model"
            )

    def sdk_version(self) -> str:
        try:
            return str(self._lite.get_sdk_version())
        except Exception:
            return "unknown"

    def inference(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        fmt = ["nchw" if a.ndim == 4 else "nhwc" for a in arrays]
        outs = self._lite.inference(inputs=arrays, data_format=fmt)
        if outs is None:
            raise RuntimeError("RKNNLite inference returned nothing (see the runtime log above)")
        return list(outs)

    def eval_perf(self) -> Any:
        fn = getattr(self._lite, "eval_perf", None)
        return fn(is_print=False) if (fn and self.perf) else None

    def eval_memory(self) -> Any:
        fn = getattr(self._lite, "eval_memory", None)
        return fn(is_print=False) if (fn and self.perf) else None

    def release(self) -> None:
        self._lite.release()


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def parse_perf_table(text: str) -> list[tuple[str, str, float, str]]:
    """Per-layer rows of an ``eval_perf()`` report (perf_debug=True):
    ``ID OpType DataType Target InputShape OutputShape Cycles Time(us) ... FullName``
    → (full name, op type, time in ms, target), slowest first."""
    rows = []
    for line in str(text).splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].isdigit():
            continue
        cyc = next((i for i, p in enumerate(parts) if re.fullmatch(r"\d+/\d+/\d+", p)), None)
        if cyc is None or cyc + 1 >= len(parts) or not re.fullmatch(r"[\d.]+", parts[cyc + 1]):
            continue
        rows.append((parts[-1], parts[1], float(parts[cyc + 1]) / 1e3, parts[3]))
    return sorted(rows, key=lambda r: r[2], reverse=True)


def parse_memory(text: Any) -> int | None:
    """``Total Memory: 19.12 MiB`` of an ``eval_memory()`` report, in bytes."""
    if isinstance(text, dict):
        for key in ("total_memory", "Total Memory", "total"):
            if isinstance(text.get(key), (int, float)):
                return int(text[key])
        text = "\n".join(f"{k}: {v}" for k, v in text.items())
    m = re.search(r"Total Memory:\s*([\d.]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)", str(text))
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None
