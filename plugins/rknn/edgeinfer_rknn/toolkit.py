"""Host side: rknn-toolkit2 (conversion, quantization, simulator).

Everything that touches ``rknn.api`` lives here and imports it lazily. The toolkit prints
long progress bars from Python (tqdm, a logging handler) *and* from C, so every call runs
inside :func:`captured`, which redirects file descriptors 1 and 2 into a log file.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import CalibrationSet, TensorSpec
from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import BackendUnavailableError, InputError

from .targets import QUANT_SUPPORT, supported_schemes  # noqa: F401  (tk.QUANT_SUPPORT, tk.supported_schemes)

if TYPE_CHECKING:
    import numpy as np

ALGORITHMS = {"normal": "normal", "mmse": "mmse", "kl": "kl_divergence", "kl_divergence": "kl_divergence"}
MAX_RULE_RETRIES = 8
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CAPTURE_LOCK = threading.RLock()  # fd redirection is process-wide: one capture at a time


# --------------------------------------------------------------------------------------------
# output capture
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def captured(log_path: Path) -> Iterator[None]:
    """Send everything written to fd 1/2 (C code included), sys.stdout/sys.stderr and the
    toolkit's logging handler to ``log_path`` (appended) while the block runs."""
    with _CAPTURE_LOCK:
        with _redirect(log_path):
            yield


@contextlib.contextmanager
def _redirect(log_path: Path) -> Iterator[None]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    stream = io.TextIOWrapper(os.fdopen(os.dup(fd), "wb", buffering=0), encoding="utf-8", errors="replace",
                              write_through=True)
    old_std = sys.stdout, sys.stderr
    handlers = [h for h in logging.getLogger("rknnLogger").handlers if isinstance(h, logging.StreamHandler)]
    old_streams = [h.stream for h in handlers]
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = sys.stderr = stream
        for h in handlers:
            h.stream = stream
        with warnings.catch_warnings():  # the toolkit's DeprecationWarnings go to the log too
            warnings.simplefilter("default")
            warnings.showwarning = lambda m, c, f, n, file=None, line=None: stream.write(
                warnings.formatwarning(m, c, f, n, line))
            yield
    finally:
        with contextlib.suppress(Exception):
            stream.flush()
        # handlers created inside the block (first RKNN()) point at our stream: send them to stderr
        for h in logging.getLogger("rknnLogger").handlers:
            if isinstance(h, logging.StreamHandler) and h.stream is stream:
                h.stream = old_std[1]
        for h, s in zip(handlers, old_streams):
            h.stream = s
        sys.stdout, sys.stderr = old_std
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in saved + [fd]:
            os.close(f)
        stream.close()


def rknn_class(log_path: Path) -> Any:
    """``rknn.api.RKNN``, imported inside the capture (the import prints torch/pkg_resources noise)."""
    with captured(log_path):
        try:
            from rknn.api import RKNN
        except Exception as e:
            raise BackendUnavailableError(
                f"rknn-toolkit2 does not import: {type(e).__name__}: {first_line(e)}",
                "pip install --no-deps rknn-toolkit2==2.5.0 (its runtime needs: see plugins/rknn/README.md)",
            ) from None
    return RKNN


# --------------------------------------------------------------------------------------------
# reading the toolkit's log
# --------------------------------------------------------------------------------------------
def clean(text: str) -> str:
    return _ANSI.sub("", text).replace("\r", "\n")


def first_error(log: str) -> str:
    """The toolkit's own error: the first ``E stage: message`` line that is not a traceback
    header, else the exception line that ends the first traceback."""
    lines = clean(log).splitlines()
    for ln in lines:
        m = re.match(r"^E (\w+): (.+)$", ln.strip())
        if m and not m.group(2).startswith("Traceback") and m.group(1) != "RKNN":
            return f"{m.group(1)}: {m.group(2).strip()}"
    for i, ln in enumerate(lines):
        if ln.strip().startswith("E ") and "Traceback" in ln:
            for nxt in lines[i + 1:]:
                s = nxt.strip()
                if re.match(r"^[\w.]+(Error|Exception|Fail\w*|InvalidGraph|InvalidArgument)\b.*:", s) or re.match(
                    r"^[\w.]+: \[ONNXRuntimeError\]", s
                ):
                    return s
    errs = [ln.strip() for ln in lines if ln.strip().startswith("E ") and "version" not in ln]
    return errs[0][2:] if errs else "no error message in the log"


def failing_rule(log: str) -> str | None:
    """The fusion rule a crashed build names (``disable_rules=['x']`` hint or ``Rule: x``)."""
    text = clean(log)
    hits = re.findall(r"disable_rules=\[\s*'([^']+)'", text)
    if hits:
        return hits[-1]
    if "Show op fuse match nodes" in text:
        rules = re.findall(r"^Rule:\s*(\S+)", text, flags=re.M)
        if rules:
            return rules[-1]
    return None


def unsupported_ops(model: Any) -> list[str]:
    """Operators of an ONNX ModelProto that no ONNX opset (or registered domain) defines:
    custom-domain and unknown ops the toolkit cannot convert."""
    import onnx.defs

    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    bad: list[str] = []
    for node in model.graph.node:
        domain = node.domain or "ai.onnx"
        label = node.op_type if domain == "ai.onnx" else f"{node.op_type} (domain {node.domain})"
        known = domain in ("ai.onnx", "ai.onnx.ml") and onnx.defs.has(node.op_type, node.domain or "")
        if not known and label not in bad:
            bad.append(label)
        elif known and domain == "ai.onnx":
            try:
                onnx.defs.get_schema(node.op_type, opsets.get("ai.onnx", 17), "")
            except Exception:
                if label not in bad:
                    bad.append(f"{label} (not in opset {opsets.get('ai.onnx')})")
    return bad


def ops_named_in_log(log: str, model: Any) -> list[str]:
    """Op types of ``model`` that the toolkit's error lines mention (e.g. 'not support op X')."""
    errs = "\n".join(ln for ln in clean(log).splitlines() if "support" in ln.lower() or ln.startswith("E "))
    types = sorted({n.op_type for n in model.graph.node})
    return [t for t in types if re.search(rf"\b{re.escape(t)}\b", errs) and re.search(
        rf"(not support\w*|unsupport\w*)[^\n]*\b{re.escape(t)}\b|\b{re.escape(t)}\b[^\n]*(not support|unsupport)",
        errs,
        flags=re.I)]


# --------------------------------------------------------------------------------------------
# the build recipe: everything needed to build the same model again (the simulator needs it)
# --------------------------------------------------------------------------------------------
@dataclass
class Recipe:
    target: str
    scheme: str
    inputs: list[dict[str, Any]]  # TensorSpec JSON, static shapes (first set when dynamic)
    outputs: list[dict[str, Any]]
    algorithm: str = "normal"
    method: str = "channel"
    dynamic_input: list[list[list[int]]] | None = None
    hybrid_fp16: list[str] = field(default_factory=list)  # tensor names kept in fp16
    disable_rules: list[str] = field(default_factory=list)
    optimization_level: int = 3
    auto_hybrid: bool = False  # the toolkit's automatic hybrid: layers below the cosine threshold stay fp16
    auto_hybrid_cos_thresh: float = 0.98
    calibration_samples: int = 0
    artifact_sha256: str = ""

    @property
    def quantized(self) -> bool:
        return self.scheme != "fp16"

    def config_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"target_platform": self.target, "optimization_level": self.optimization_level}
        if self.quantized:
            kw.update(quantized_dtype=self.scheme, quantized_algorithm=ALGORITHMS[self.algorithm],
                      quantized_method=self.method)
        if self.auto_hybrid:
            kw["auto_hybrid_cos_thresh"] = self.auto_hybrid_cos_thresh
        if self.dynamic_input:
            kw["dynamic_input"] = self.dynamic_input
        if self.disable_rules:
            kw["disable_rules"] = list(self.disable_rules)
        return kw

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Recipe:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def sidecar(artifact: Path) -> Path:
    """Tar file next to the artifact with the build inputs (recipe, calibration set; before 2026-12-05 the source
    ONNX too) the simulator rebuilds from: the toolkit simulates only models it built itself, never a .rknn."""
    return artifact.with_name(artifact.name + ".src.tar")


def source_model(artifact: Path) -> Path:
    """The source ONNX the artifact was built from, beside it and not in the tar: a bucketed bundle's artifacts
    are built from one ONNX with a shape each (in the recipe), and equal files are kept once
    (``edgeinfer.files.link_duplicates``), where nine tars held nine copies."""
    return artifact.with_name(artifact.name + ".src.onnx")


def pack(folder: Path, tar_path: Path) -> None:
    import tarfile

    with tarfile.open(tar_path, "w") as tf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                tf.add(p, arcname=str(p.relative_to(folder)))


def unpack(tar_path: Path, folder: Path) -> None:
    import tarfile

    with tarfile.open(tar_path) as tf:
        tf.extractall(folder, filter="data")


def log_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".log")


def write_calibration(calibration: CalibrationSet, inputs: Sequence[TensorSpec], folder: Path) -> int:
    """The layout the toolkit expects: one .npy per input per sample and ``dataset.txt`` with one
    line per sample, the sample's .npy paths (relative to the folder) separated by spaces, in input order."""
    import numpy as np
    (folder / "calib").mkdir(parents=True, exist_ok=True)
    lines, n = [], 0
    for i, feeds in enumerate(calibration):
        names = []
        for k, spec in enumerate(inputs):
            name = f"calib/{i:05d}_{k}.npy"
            np.save(folder / name, np.ascontiguousarray(np.asarray(feeds[spec.name])))
            names.append(name)
        lines.append(" ".join(names))
        n += 1
    (folder / "dataset.txt").write_text("\n".join(lines) + "\n")
    return n


def absolute_dataset(folder: Path, work: Path) -> Path:
    """A copy of ``folder/dataset.txt`` with absolute paths (the toolkit opens them from its cwd)."""
    lines = []
    for ln in (folder / "dataset.txt").read_text().splitlines():
        if ln.strip():
            lines.append(" ".join(str((folder / p).resolve()) for p in ln.split()))
    out = work / "dataset.abs.txt"
    out.write_text("\n".join(lines) + "\n")
    return out


class BuildError(Exception):
    def __init__(self, stage: str, message: str, rule: str | None):
        super().__init__(f"{stage}: {message}")
        self.stage, self.message, self.rule = stage, message, rule


def _call(log: Path, stage: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one toolkit call inside the capture; return codes and exceptions become BuildError."""
    start = log.stat().st_size if log.exists() else 0
    exc: BaseException | None = None
    ret: Any = None
    with captured(log):
        try:
            ret = fn(*args, **kwargs)
        except BaseException as e:  # the toolkit raises ValueError with a traceback text; some paths sys.exit
            exc = e
    if exc is not None or (isinstance(ret, int) and ret != 0):
        with open(log, "rb") as f:
            f.seek(start)
            tail = f.read().decode("utf-8", "replace")
        msg = first_error(tail)
        if msg == "no error message in the log" and exc is not None:
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        raise BuildError(stage, msg, failing_rule(tail))
    return ret


def build(model: Path, recipe: Recipe, folder: Path, log: Path, work: Path) -> Any:
    """Build the model described by ``recipe`` with a fresh RKNN object; return it (built, not exported).

    ``folder`` holds the calibration set (``dataset.txt`` + ``calib/``) for quantized schemes;
    ``work`` is a scratch folder (hybrid quantization writes its intermediate files there).
    """
    RKNN = rknn_class(log)
    with captured(log):
        rknn = RKNN(verbose=False)
    try:
        _call(log, "config", rknn.config, **recipe.config_kwargs())
        names = [s["name"] for s in recipe.inputs]
        sizes = [list(s["shape"]) for s in recipe.inputs]
        _call(log, "load_onnx", rknn.load_onnx, str(model), inputs=names, input_size_list=sizes)
        dataset = str(absolute_dataset(folder, work)) if recipe.quantized else None
        if recipe.quantized and recipe.hybrid_fp16:
            rknn = _hybrid(rknn, RKNN, model, recipe, dataset, log, work)
        else:
            kw = {"auto_hybrid": True} if (recipe.quantized and recipe.auto_hybrid) else {}
            _call(log, "build", rknn.build, do_quantization=recipe.quantized, dataset=dataset, **kw)
        return rknn
    except BaseException:
        with captured(log), contextlib.suppress(Exception):
            rknn.release()
        raise


def _hybrid(rknn: Any, RKNN: Any, model: Path, recipe: Recipe, dataset: str | None, log: Path, work: Path) -> Any:
    """hybrid_quantization_step1 → mark the named tensors float16 in the generated cfg → step2."""
    cwd = os.getcwd()
    os.chdir(work)  # step1 writes <stem>.model/.data/.quantization.cfg into the current directory
    try:
        _call(log, "hybrid_quantization_step1", rknn.hybrid_quantization_step1, dataset=dataset)
    finally:
        os.chdir(cwd)
    with captured(log), contextlib.suppress(Exception):
        rknn.release()
    cfgs = sorted(work.glob("*.quantization.cfg"))
    if not cfgs:
        raise BuildError("hybrid_quantization_step1", "wrote no .quantization.cfg", None)
    cfg = cfgs[0]
    stem = cfg.name[: -len(".quantization.cfg")]
    patch_hybrid_cfg(cfg, recipe.hybrid_fp16, constant_names(work / f"{stem}.model"))
    rknn2 = None
    with captured(log):
        rknn2 = RKNN(verbose=False)
    try:
        _call(log, "config", rknn2.config, **recipe.config_kwargs())
        _call(log, "hybrid_quantization_step2", rknn2.hybrid_quantization_step2,
              model_input=str(work / f"{stem}.model"), data_input=str(work / f"{stem}.data"),
              model_quantization_cfg=str(cfg))
    except BaseException:
        with captured(log), contextlib.suppress(Exception):
            rknn2.release()
        raise
    return rknn2


def cfg_tensor_names(cfg_text: str) -> list[str]:
    """Tensor names listed under ``quantize_parameters:`` in a step1 cfg."""
    names, inside = [], False
    for ln in cfg_text.splitlines():
        if ln.startswith("quantize_parameters:"):
            inside = True
            continue
        if inside:
            if ln and not ln[0].isspace():
                break
            m = re.match(r"^ {4}(\S.*):\s*$", ln)
            if m:
                names.append(m.group(1).strip("'\""))
    return names


def constant_names(model_path: Path) -> set[str]:
    """Weights and constants of step1's ``.model`` graph (an ONNX protobuf): the cfg lists them
    too, but step2 rejects them as custom layers ("Invalid operands name")."""
    try:
        import onnx

        proto = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return set()
    names = {i.name for i in proto.graph.initializer}
    names |= {o for n in proto.graph.node if n.op_type == "Constant" for o in n.output}
    return names


def patch_hybrid_cfg(cfg: Path, tensors: Sequence[str], constants: set[str] = frozenset()) -> None:
    """Put ``tensor: float16`` entries under ``custom_quantize_layers``, editing the text only
    (re-saving the YAML changes float digits, which step2 rejects as modified scales)."""
    text = cfg.read_text()
    known = set(cfg_tensor_names(text))
    known -= set(constants)
    missing = [t for t in tensors if t not in known]
    if missing:
        near = sorted({k for t in missing for k in known if k.startswith(re.sub(r"_output_\d+$", "", t))})
        hint = f"names the toolkit has there: {', '.join(near[:12])}" if near else \
            f"e.g. {', '.join(sorted(known)[:3])}"
        raise InputError(
            f"hybrid layer(s) not found in the quantized graph (the toolkit fuses and renames layers): "
            f"{', '.join(missing)}; {hint}"
        )
    block = "custom_quantize_layers:\n" + "".join(f"    '{t}': float16\n" for t in tensors)
    pattern = re.compile(r"^custom_quantize_layers:.*?(?=^quantize_parameters:)", flags=re.M | re.S)
    if not pattern.search(text):
        raise BuildError("hybrid_quantization_step1", "unexpected .quantization.cfg layout", None)
    cfg.write_text(pattern.sub(lambda _m: block, text, count=1))


def hybrid_tensor_names(model: Any, requested: Sequence[str]) -> list[str]:
    """Map requested names (ONNX node names or tensor names) to tensor names: a node name
    stands for its outputs."""
    by_node = {n.name: list(n.output) for n in model.graph.node if n.name}
    out: list[str] = []
    for name in requested:
        for t in by_node.get(name, [name]):
            if t not in out:
                out.append(t)
    return out


# --------------------------------------------------------------------------------------------
# in-process hand-over of a freshly built model to the simulator
# --------------------------------------------------------------------------------------------
_BUILT: dict[tuple[str, str], Any] = {}


def keep_built(artifact: Path, sha: str, rknn: Any, log: Path) -> None:
    """Keep the last built RKNN object so that loading the artifact in the same process skips
    the rebuild; at most one is kept (they are large)."""
    while _BUILT:
        _, old = _BUILT.popitem()
        with captured(log), contextlib.suppress(Exception):
            old.release()
    _BUILT[(str(artifact.resolve()), sha)] = rknn


def take_built(artifact: Path, sha: str) -> Any | None:
    return _BUILT.pop((str(artifact.resolve()), sha), None)


def release(rknn: Any, log: Path) -> None:
    with captured(log), contextlib.suppress(Exception):
        rknn.release()


def export(rknn: Any, path: Path, log: Path) -> None:
    _call(log, "export_rknn", rknn.export_rknn, str(path))


def init_simulator(rknn: Any, log: Path) -> None:
    _call(log, "init_runtime", rknn.init_runtime)


def infer(rknn: Any, arrays: list[np.ndarray], log: Path) -> list[np.ndarray]:
    fmt = ["nchw" if a.ndim == 4 else "nhwc" for a in arrays]
    outs = _call(log, "inference", rknn.inference, inputs=arrays, data_format=fmt)
    if outs is None:
        raise BuildError("inference", first_error(log.read_text(errors="replace")[-20000:]), None)
    return outs


def write_recipe(folder: Path, recipe: Recipe) -> None:
    (folder / "recipe.json").write_text(json.dumps(recipe.to_json(), indent=2) + "\n")


def read_recipe(folder: Path) -> Recipe:
    return Recipe.from_json(json.loads((folder / "recipe.json").read_text()))


def copy_source(src: Path, dst: Path) -> None:
    """A copy, not a link: editing the source in place later must not change what the simulator rebuilds."""
    shutil.copyfile(src, dst)


def timed() -> Any:
    t = time.perf_counter()
    return lambda: time.perf_counter() - t
