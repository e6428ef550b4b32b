"""Segments: split a model and convert every segment with a backend (a segmented deploy does so into its
bundle), and the cached quick-try path ``edgeinfer run MODEL.onnx --paging W`` (:func:`open_paged`)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where arrays are made, so `edgeinfer plan --paging` stays light
    import numpy as np

from edgeinfer.contract import cache, stamp
from edgeinfer.contract import registry as plugins
from edgeinfer.contract.backend import Backend, CalibrationSet
from edgeinfer.contract.names import ENCODER_REFERENCE
from edgeinfer.errors import BackendUnavailableError, InputError
from edgeinfer.run.paged import PagedSession
from edgeinfer.run.split import INDEX, split_onnx


# ------------------------------------------------------------------------------------------------
# deploy / quick-try helpers
# ------------------------------------------------------------------------------------------------
def _segment_calibration(paths: Sequence[Path], calibration: CalibrationSet, model_inputs: Sequence[str]
                         ) -> list[CalibrationSet]:
    """Each segment's calibration feeds: the set run through the fp32 segments before it (on the
    reference backend)."""
    try:
        ref = plugins.get_backend(ENCODER_REFERENCE)
    except BackendUnavailableError as e:
        raise InputError(f"calibrating a segmented model needs the {ENCODER_REFERENCE} backend on the "
                         f"converting machine: {e.one_line()}") from None
    sessions = [ref.load(p) for p in paths]
    per_seg: list[list[dict[str, np.ndarray]]] = [[] for _ in paths]
    try:
        for feeds in calibration:
            env: dict[str, np.ndarray] = dict(feeds)
            for k, s in enumerate(sessions):
                want = {i.name: env[i.name] for i in s.inputs}
                per_seg[k].append(want)
                env.update(s.run(want))
    finally:
        for s in sessions:
            s.close()
    return [CalibrationSet(x) for x in per_seg]


def deploy_segments(
    backend: Backend,
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    scheme: str | None,
    calibration: CalibrationSet | None,
    segments: int | None = None,
    cuts: Sequence[str] | None = None,
    **quantize_options: Any,
) -> list[Path]:
    """Split ``model_path``, convert every segment with ``backend.quantize`` into ``out_dir``
    (``segment_NN<suffix>`` plus each artifact's side files and stamp), return the artifact paths
    in order. ``shapes`` in ``quantize_options`` fixes the model's input shapes before splitting
    (segments then get static shapes everywhere). Calibration feeds are propagated through the
    fp32 segments so every segment is calibrated on its own inputs."""
    import shutil
    import tempfile

    out = Path(out_dir)
    shapes = quantize_options.pop("shapes", None)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-split-") as tmp:
        infos = split_onnx(model_path, tmp, segments=segments, cuts=cuts, shapes=shapes)
        out.mkdir(parents=True, exist_ok=True)  # only once the split is known to work
        calib = _segment_calibration([i.path for i in infos], calibration, []) if calibration is not None else None
        suffix = backend.tensors.native[0] if backend.tensors.native else ".onnx"
        paths = []
        for info in infos:
            dst = out / f"segment_{info.index:02d}{suffix}"
            paths.append(backend.quantize(info.path, scheme, calib[info.index] if calib else None, dst,
                                          **quantize_options))
        shutil.copyfile(Path(tmp) / INDEX, out / INDEX)
    return paths


def open_paged(
    model: str | os.PathLike[str],
    backend: str | None = None,
    device: str | None = None,
    window: int = 1,
    segments: int | None = None,
    cuts: Sequence[str] | None = None,
    prefetch: bool = True,
    resident_prefix: int | None = None,
    scheme: str | None = None,
    **options: Any,
) -> PagedSession:
    """``edgeinfer run MODEL.onnx --paging W --segments N``: split, convert (cached) and open paged."""

    src = Path(model)
    if not src.is_file():
        raise InputError(f"model file not found: {src}", kind="model_not_found")
    if src.suffix.lower() != ".onnx":
        raise InputError(f"--paging splits ONNX models; {src.name} is not .onnx (deploy a paged bundle instead)")
    if segments is None and not cuts:
        raise InputError("--paging needs --segments N or --cut TENSOR")
    be = plugins.get_backend(backend or ENCODER_REFERENCE)
    key = cache.key({
        "sha256": stamp.sha256_file(src), **cache.made_by(be), "scheme": scheme,
        "segments": segments, "cuts": list(cuts or []), "shapes": options.get("shapes"),
    })
    folder = cache.area("paged") / be.name / key
    done = folder / ".complete"
    with cache.locked(folder):  # a concurrent run of the same split waits for this one's segments
        if done.exists():
            paths = [folder / p for p in json.loads(done.read_text())]
        else:
            conv = {k: options.pop(k) for k in ("shapes", "target") if k in options}
            try:
                paths = deploy_segments(be, src, folder, scheme, None, segments=segments, cuts=cuts, **conv)
            except BaseException:  # a bad --cut, or interrupted: no half-split model left in the cache
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.write_text(json.dumps([p.name for p in paths]))
    return PagedSession.from_artifacts(be, paths, device=device, window=window, prefetch=prefetch,
                                       resident_prefix=resident_prefix, **options)

