"""``edgeinfer deploy``: one model → a checked bundle for one board.

plan (refuse what does not fit) → source (HF directory exported to ONNX when the
backend takes ONNX) → calibration samples → the board's backend ``quantize`` →
golden check against onnxruntime fp32 on held-out samples → bundle directory.
Conversions and their golden results are cached, keyed by (model hash, board,
scheme, shapes, calibration, backend versions).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgeinfer import files
from edgeinfer.contract import cache, remote_code, seal, stamp
from edgeinfer.contract import registry as plugins
from edgeinfer.contract.backend import CalibrationSet, TensorSpec
from edgeinfer.contract.names import ENCODER_REFERENCE
from edgeinfer.deploy import buckets as buckets_mod
from edgeinfer.deploy import calibration, golden, outdir, scoring
from edgeinfer.errors import CheckFailed, InputError
from edgeinfer.model import bundle as bundle_mod
from edgeinfer.model import samples as golden_samples
from edgeinfer.model.bundle import Manifest, TextSpec
from edgeinfer.model.kind import Kind, kind
from edgeinfer.planning.boards import Board, get_board
from edgeinfer.planning.decision import ENCODER_SEQUENCE
from edgeinfer.progress import Progress
from edgeinfer.run import bundle as run_bundle
from edgeinfer.run.once import onnx_index_limits
from edgeinfer.run.padding import run_padded

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
DEFAULT_SEQ = ENCODER_SEQUENCE  # the tokenizer's length where the model fixes none
GOLDEN_SAMPLES = 16
NEEDS_CALIBRATION = ("w8a8",)

Feeds = dict[str, np.ndarray]


@dataclass
class Source:
    path: Path
    kind: str  # "onnx" | "hf" | "pt2"
    sha256: str

    @property
    def hf_dir(self) -> Path | None:
        return self.path if self.kind == "hf" else None


@dataclass
class DeployResult:
    bundle: Path | None
    manifest: Manifest
    golden: dict[str, Any]
    cached: bool
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        m = self.manifest
        return {"bundle": str(self.bundle) if self.bundle else None, "cached": self.cached, "backend": m.backend,
                "board": m.board, "scheme": m.scheme, "golden": self.golden, "plan": m.plan, "buckets": m.buckets,
                "left_out": m.left_out, "warnings": self.warnings, "timings_s": self.timings}


def source_of(model: str | os.PathLike[str]) -> Source:
    p = Path(model)
    sources = "pass a Hugging Face directory, an .onnx file or a .pt2 program"
    match kind(p, hint=sources):
        case Kind.ENCODER_DIR:
            what = "hf"
        case Kind.ONNX:
            what = "onnx"
        case Kind.PT2:
            what = "pt2"
        case Kind.DECODER_DIR:
            raise InputError(f"{p} is a causal language model: deploy it with "
                             "edgeinfer.deploy.decoder.deploy_decoder (the CLI does so by itself)")
        case Kind.DECODER_FILE:
            how = " (--runtime llama.cpp --quant gguf:Q8_0 builds a GGUF)" if p.suffix.lower() == ".gguf" else ""
            raise InputError(f"cannot deploy {p.name}, a decoder file: it runs as it is (generate, chat, bench, "
                             f"serve); deploy builds a golden-checked bundle from its Hugging Face directory{how}")
        case found:
            raise InputError(f"cannot deploy {p.name}, a {found.value}: {sources}")
    return Source(p, what, stamp.sha256_file(p))


def board_target(board: Board) -> str:
    """What the backend compiles for: the board's ``target`` or its family."""
    return board.target or board.family


def convert_options(backend: Any, board: Board, options: dict[str, Any] | None) -> dict[str, Any]:
    """What deploy passes ``convert``: the board's target to a backend that declares the option ``target``,
    then the user's ``--option`` values (``quantize`` refuses one the backend does not declare)."""
    own = {"target": board_target(board)} if "target" in backend.tensors.convert_options else {}
    return {**own, **(options or {})}


# --- the steps -------------------------------------------------------------------------------------


def reference_onnx(src: Source, shapes: dict[str, list[int]], progress: Progress) -> Path | None:
    """The fp32 ONNX the golden check runs on onnxruntime (exported once per model and shapes)."""
    if src.kind == "onnx":
        return src.path
    if src.kind == "pt2":
        return None
    from edgeinfer.deploy.export import export_hf_onnx

    entry = cache.area("deploy") / "onnx" / cache.key([src.sha256, shapes], length=20)
    if not (cache.intact(entry) and (entry / "model.onnx").is_file()):  # the golden reference: never a damaged one
        with progress.step(f"exporting {src.path.name} to ONNX"):
            cache.fill(entry, lambda d: export_hf_onnx(src.path, d / "model.onnx", shapes or None))
    return entry / "model.onnx"


def with_shapes(specs: list[TensorSpec], shapes: dict[str, list[int]]) -> list[TensorSpec]:
    unknown = set(shapes) - {s.name for s in specs}
    if unknown:
        names = ", ".join(s.name for s in specs)
        raise InputError(f"--shape names unknown input(s) {', '.join(sorted(unknown))}; the model's inputs: {names}")
    return [TensorSpec(s.name, tuple(shapes[s.name]), s.dtype) if s.name in shapes else s for s in specs]


def default_shapes(specs: list[TensorSpec], static: bool, seq: int) -> dict[str, list[int]]:
    """Static shapes for a static-shape target: batch 1 and ``seq`` for symbolic dims."""
    if not static:
        return {}
    out = {}
    for s in specs:
        if not s.is_static:
            out[s.name] = [1 if i == 0 else (seq if not isinstance(d, int) else d) for i, d in enumerate(s.shape)]
    return out


def tokenizer_fn(hf_dir: Path | None, specs: list[TensorSpec]):
    """texts → feeds, with the model's own tokenizer, padded to the model's sequence length."""
    if hf_dir is None or not (hf_dir / "tokenizer.json").is_file():
        return None
    seq_dims = [s.shape[1] for s in specs if len(s.shape) > 1 and isinstance(s.shape[1], int)]
    tok = run_bundle.load_tokenizer(hf_dir / "tokenizer.json", seq_dims[0] if seq_dims else DEFAULT_SEQ)
    return lambda texts: run_bundle.tokenize(tok, texts, specs)


def text_spec(hf_dir: Path | None, seq: int, output: str) -> TextSpec | None:
    """Pooling and normalisation as the model declares them (sentence-transformers files)."""
    if hf_dir is None or not (hf_dir / "tokenizer.json").is_file():
        return None
    pooling, normalize = "none", False
    pool_cfg = hf_dir / "1_Pooling" / "config.json"
    if pool_cfg.is_file():
        cfg = json.loads(pool_cfg.read_text())
        mean = "mean" if cfg.get("pooling_mode_mean_tokens") else "none"
        pooling = "cls" if cfg.get("pooling_mode_cls_token") else mean
    modules = hf_dir / "modules.json"
    if modules.is_file():
        normalize = any("Normalize" in m.get("type", "") for m in json.loads(modules.read_text()))
    return TextSpec(tokenizer="tokenizer", max_length=seq, pooling=pooling, normalize=normalize, output=output)


# --- the whole job -------------------------------------------------------------------------------------


@remote_code.entry_point
def deploy(
    model: str | os.PathLike[str],
    board: str | os.PathLike[str],
    out: str | os.PathLike[str] | None,
    *,
    quant: str | None = None,
    calib: str | os.PathLike[str] | None = None,
    golden_inputs: str | os.PathLike[str] | None = None,
    shapes: dict[str, list[int]] | None = None,
    force: bool = False,
    threshold: float | None = None,
    max_samples: int = calibration.DEFAULT_SAMPLES,
    options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    use_cache: bool = True,
    paging: int | None = None,
    segments: int | None = None,
    cuts: list[str] | None = None,
    buckets: str | None = None,
    trust_remote_code: bool = False,
    dry_run: bool = False,
    on_plan: Callable[[Any], None] | None = None,
    task_thresholds: dict[str, float] | None = None,
    board_only: bool = False,
) -> DeployResult | outdir.DryRun:
    """Scheme and sequence length are the plan's (:mod:`edgeinfer.planning.decision`, as ``edgeinfer plan``
    decides them; the sequence from ``shapes`` when given): ``on_plan`` is called with the plan before
    converting, once every input is checked; ``dry_run`` returns it
    (:class:`~edgeinfer.deploy.outdir.DryRun`), exporting and writing nothing. ``trust_remote_code``: let
    libraries import the Python files a model directory names in ``auto_map`` (otherwise such a directory is
    refused before any work). ``task_thresholds``: rerankers' and classifiers' golden thresholds
    (:mod:`edgeinfer.deploy.ranking`). ``board_only``: leave out of the bundle what only the backend's simulator on
    this machine reads (:func:`~edgeinfer.deploy.outdir.leave_out_simulation`), after the golden check."""
    from edgeinfer.planning.planner import plan as make_plan

    progress = progress or Progress(enabled=False)
    warnings: list[str] = []
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        outdir.check_out_dir(out_dir)
    elif not dry_run:
        raise InputError("deploy needs -o: the bundle directory to write")
    _check_numbers(threshold, max_samples)
    b = get_board(board)
    src = source_of(model)
    if src.hf_dir is not None:
        remote_code.allowed(src.hf_dir)
        check_tokenizer(src.hf_dir)
    bucket_arg = buckets_mod.parse(buckets)

    # 1. plan first (plan's own decision of runtime, scheme and sequence length): refuse what cannot be built
    # here or does not fit before exporting or converting anything
    user_shapes = dict(shapes or {})
    first = next(iter(user_shapes.values()), None)
    batch = first[0] if first else 1
    with progress.step(f"planning {src.path.name} on {b.name}"):
        the_plan = make_plan(str(src.path), b, quant=quant, ctx=first[1] if first and len(first) > 1 else None,
                             batch=batch)
    the_plan.decision.refuse_unbuildable(b)
    if dry_run:
        return outdir.DryRun(the_plan)
    if not the_plan.fits and not force:
        raise CheckFailed(
            f"{src.path.name} does not fit {b.name} with {the_plan.scheme.name}: {'; '.join(the_plan.reasons)} "
            f"(see `edgeinfer plan`, or pass --force)"
        )
    if not the_plan.fits:
        warnings.append(f"deploying although the plan says it does not fit: {'; '.join(the_plan.reasons)}")
    backend = plugins.get_backend(b.backend)
    scheme, seq = the_plan.scheme.name, the_plan.ctx
    if not calib and scheme.split("_")[0] in NEEDS_CALIBRATION:
        raise InputError(f"scheme {scheme} needs calibration data: pass --calib (a .txt of samples, .npz or a "
                         "directory)")
    threshold = golden.default_threshold(scheme) if threshold is None else threshold
    layout = _paging_layout(paging, segments, cuts, backend)

    # 2. reference model (fp32 ONNX on onnxruntime) and the input specs the board will see
    static = "dynamic_shapes" in backend.tensors.gaps or board_target(b) == "npu"
    if src.kind == "pt2":
        raise InputError("deploying a .pt2 program has no ONNX reference for the golden check; deploy the HF "
                         "directory")
    ref_path = reference_onnx(src, user_shapes, progress)
    reference = plugins.get_backend(ENCODER_REFERENCE).load(ref_path)
    dynamic = (ref_path, reference.inputs)  # before any static re-export: what buckets are converted from
    auto = default_shapes(with_shapes(reference.inputs, user_shapes), static, seq)
    if auto and src.kind == "hf" and not user_shapes:  # re-export with static shapes: toolkits fold them better
        reference.close()
        user_shapes = auto
        ref_path = reference_onnx(src, user_shapes, progress)
        reference = plugins.get_backend(ENCODER_REFERENCE).load(ref_path)
    shapes_used = {**auto, **user_shapes}
    specs = with_shapes(reference.inputs, shapes_used)
    _check_shapes_option(backend, src, reference.inputs, shapes_used)
    bucketing = _bucketing(bucket_arg, static, bool(shapes), layout, dynamic, src, b, scheme, seq, progress,
                           "shapes" in backend.tensors.convert_options)

    # 3. samples: calibration and held-out golden inputs
    tokenize = tokenizer_fn(src.hf_dir, specs)
    scorer, query_samples = scoring.prepare(src.hf_dir, golden_inputs, tokenize, task_thresholds)
    calib_samples: list[Feeds] = []
    held: list[Feeds] = []
    if calib:
        loaded = calibration.load_samples(Path(calib), specs, tokenize, pairs=scoring.takes_pairs(scorer))
        calib_samples, held = calibration.split(loaded, limit=max_samples, heldout=GOLDEN_SAMPLES)
        if len(calib_samples) < calibration.FEW_SAMPLES:
            warnings.append(
                f"only {len(calib_samples)} calibration samples (at least {calibration.FEW_SAMPLES} recommended); "
                "quantization ranges may be poor"
            )
    if query_samples:  # a reranker's held-out queries, each a batch of (query, document) pairs
        held = query_samples
    elif golden_inputs:
        held = calibration.load_samples(Path(golden_inputs), specs, tokenize)
    if not held:
        held = calibration.fallback_samples(specs, tokenize, GOLDEN_SAMPLES)
        warnings.append(f"golden check on {len(held)} built-in samples (pass --golden-inputs for your own data)")

    # 4. convert (or reuse the cached bundle), golden check, bundle: every input checked, the plan is announced
    if on_plan:
        on_plan(the_plan)
    key = _cache_key(src, b, scheme, shapes_used, backend, calib_samples, held,
                     {**(options or {}), **layout, **({"buckets": bucketing[0]} if bucketing else {}),
                      **({"task": [scorer.task.model_dump(), scorer.limits]} if scorer else {})})
    cached_dir = cache.area("deploy") / key
    files.sweep(outdir.tmp_parent(out_dir))  # what a killed earlier deploy left next to -o
    cache.sweep_deploy()
    # a concurrent deploy of the same conversion waits for this one's result and reuses it
    with cache.locked(cached_dir) if use_cache else contextlib.nullcontext():
        cached = use_cache and cache.reusable(cached_dir, progress.note)
        with files.temp_dir(outdir.tmp_parent(out_dir), "deploy") as tmp:
            work = tmp / "bundle"
            if cached:
                progress.note(f"reusing the cached conversion of {src.path.name} for {b.name} ({scheme}): "
                              f"{cached_dir}")
                files.copy_tree(cached_dir, work, ignore=shutil.ignore_patterns(seal.SEAL))
                manifest = bundle_mod.Bundle.open(work).manifest
                needs = outdir.requires(backend, decoder=False, text=tokenize is not None)
                plan = outdir.plan_summary(the_plan)  # this planner's: serve's start-up check adds up recorded plans
                stale = manifest.requires != needs or manifest.index_limits is None or manifest.plan != plan
                if stale:  # cached by an older edgeinfer: what runs and plans it is this installation's
                    manifest.requires, manifest.plan = needs, plan
                    if manifest.index_limits is None:
                        manifest.index_limits = onnx_index_limits([work / a for a in manifest.artifacts])
                    bundle_mod.write(work, manifest)
            else:
                work.mkdir()
                manifest = _build(src, b, backend, scheme, work, ref_path, reference, specs, shapes_used,
                                  calib_samples, held, threshold, the_plan, tokenize, seq, options, progress, layout,
                                  bucketing, scorer)
                files.link_duplicates(work)  # before the cache's copy, which keeps the links
                if use_cache:
                    try:
                        cache.store(cached_dir, work)
                    except BaseException:  # interrupted mid-copy: leave no partial entry behind
                        files.remove_own(cached_dir.parent)
                        raise
            reference.close()
            if cached:
                files.link_duplicates(work)  # an entry cached before bundles kept one copy of equal files
            if board_only:
                outdir.leave_out_simulation(work, backend, manifest)
                bundle_mod.write(work, manifest)
            outdir.replace_dir(work, out_dir)
    return DeployResult(out_dir, manifest, manifest.golden or {}, cached, warnings, dict(progress.timings))


def _build(src, b, backend, scheme, work, ref_path, reference, specs, shapes_used, calib_samples, held,
           threshold, the_plan, tokenize, seq, options, progress, layout, bucketing=None, scorer=None) -> Manifest:
    """Convert into ``work``, run the golden check, and write the bundle there; raise if the check fails."""
    convert_input = src.path if src.kind in backend.tensors.sources else ref_path
    convert_opts = convert_options(backend, b, options)
    if convert_input == ref_path and shapes_used and "shapes" in backend.tensors.convert_options:
        convert_opts.setdefault("shapes", shapes_used)
    cal_set = CalibrationSet(calib_samples) if calib_samples else None
    with progress.step(f"converting to {backend.name} {scheme} for {board_target(b)}"):
        if layout:
            from edgeinfer.run.segments import deploy_segments

            artifacts = deploy_segments(backend, convert_input, work, scheme, cal_set, layout.get("segments"),
                                        layout.get("cuts"), **convert_opts)
        else:
            artifacts = [work / ("model" + backend.tensors.native[0])]
            backend.quantize(convert_input, scheme, cal_set, artifacts[0], **convert_opts)
    artifact = artifacts[0]
    paging_spec = {"window": layout["window"], "prefetch": True} if layout else None
    if layout:
        from edgeinfer.run.paged import PagedSession

        opened = PagedSession.from_artifacts(backend, artifacts, window=layout["window"])
    else:
        opened = backend.load(artifact)
    with opened as session:
        outputs = list(session.outputs)
        cand, expected = [], []
        for s in progress.track(held, "golden check", total=len(held)):
            cand.append(run_padded(session, s))
            expected.append(run_padded(reference, s))
        report = golden.compare(expected, cand, held, threshold)
        report["device"] = session.device
        if scorer:
            scorer.judge(report, expected, cand)
    if not report["passed"]:
        why = (scorer and scorer.failure(report)) or \
            f"{golden.summary_line(report)}; worst: {golden.worst_samples_line(report) or 'n/a'}"
        raise CheckFailed(
            f"{why} — the bundle was not written (try fp16, more or better --calib data, or "
            f"{'--task-threshold' if scorer else '--threshold'})",
            kind="golden_failed",
        )
    bucket_section = None
    if bucketing:
        shapes, chosen_by, dyn_path, dyn_specs = bucketing
        items = buckets_mod.build(backend, dyn_path, work, scheme, shapes, (1, seq), artifact.name, dyn_specs,
                                  calib_samples, held, reference, threshold, convert_options(backend, b, options),
                                  report, progress, scorer)
        bucket_section = {"chosen_by": chosen_by, "items": items}
    st = stamp.read(artifact) or {}
    out_name = outputs[0].name if outputs else "last_hidden_state"
    manifest = Manifest(
        backend=backend.name,
        versions=st.get("versions", backend.versions()),
        board=b.name,
        target=st.get("target", board_target(b)),
        scheme=scheme,
        artifacts=[a.name for a in artifacts],
        inputs=specs if layout or not st.get("inputs") else [TensorSpec.from_json(s) for s in st["inputs"]],
        outputs=outputs,
        source={"name": src.path.name, "sha256": src.sha256, "kind": src.kind},
        text=text_spec(src.hf_dir, seq, out_name) if tokenize is not None else None,
        task=scorer.task if scorer else None,
        plan=outdir.plan_summary(the_plan),
        golden=report,
        paging=paging_spec,
        buckets=bucket_section,
        index_limits=onnx_index_limits(artifacts),
        requires=outdir.requires(backend, decoder=False, text=tokenize is not None),
    )
    if manifest.text is not None:
        tok_dir = work / "tokenizer"
        tok_dir.mkdir()
        for name in TOKENIZER_FILES:
            if (src.path / name).is_file():
                shutil.copy2(src.path / name, tok_dir / name)
    (work / "golden").mkdir()
    golden_samples.save_samples(work / "golden" / "inputs.npz", held)
    golden_samples.save_samples(work / "golden" / "expected.npz", expected)
    if scorer:
        scorer.save(work / "golden")
    bundle_mod.write(work, manifest)
    return manifest


def _bucketing(arg, static: bool, user_shapes: bool, layout: dict, dynamic: tuple, src: Source, board: Board,
               scheme: str, seq: int, progress: Progress, takes_shapes: bool) -> tuple | None:
    """(shapes, how they were chosen, dynamic model, its input specs) for a bucketed bundle, or None; each
    bucket is converted with the convert option ``shapes``, so a backend that does not declare it gets none."""
    explicit = isinstance(arg, list)
    if arg == "none" or not (static or explicit):
        return None
    path, specs = dynamic
    why_not = ("--shape fixes the shape" if user_shapes else "paging bundles are not bucketed" if layout
               else "the model has no free batch axis" if not buckets_mod.usable(specs)
               else "the board's backend takes no convert option 'shapes'" if not takes_shapes else "")
    if why_not:
        if explicit:
            raise InputError(f"--buckets cannot be used here: {why_not}")
        return None
    if explicit:
        if (1, seq) not in arg or max(s for _, s in arg) > seq:
            raise InputError(f"--buckets must include 1x{seq} (the deployed shape) and no longer sequence")
        return arg, "given with --buckets", path, specs
    with progress.step(f"choosing (batch x sequence) buckets for {board.name}"):
        shapes, why = buckets_mod.auto(src.path, board, scheme, seq, buckets_mod.masked(specs))
    return (shapes, why, path, specs) if len(shapes) > 1 else None


def _check_shapes_option(backend, src: Source, ref_inputs: list[TensorSpec], shapes: dict[str, list[int]]) -> None:
    """Deploy fixes free dimensions of the ONNX it converts with the convert option ``shapes``: refused, before
    any work, for a backend that does not declare it."""
    converts_ref = src.kind == "onnx" or src.kind not in backend.tensors.sources
    if (converts_ref and shapes and "shapes" not in backend.tensors.convert_options
            and not all(s.is_static for s in ref_inputs)):
        raise InputError(f"backend {backend.name!r} takes no convert option 'shapes', so it cannot fix the free "
                         f"dimensions of {src.path.name} to {shapes}: export the model with static shapes, or "
                         "deploy its Hugging Face directory")


def _paging_layout(window: int | None, segments: int | None, cuts: list[str] | None, backend) -> dict[str, Any]:
    """The segmented layout asked for, or {} for an ordinary bundle."""
    if window is None:
        if segments or cuts:
            raise InputError("--segments/--cut split a model for paging: add --paging W (segments resident at once)")
        return {}
    if window < 1:
        raise InputError(f"--paging must be at least 1 segment, got {window}")
    if segments and cuts:
        raise InputError("give either --segments N or --cut TENSOR ..., not both")
    if "onnx" not in backend.tensors.sources:
        raise InputError(f"paging splits ONNX models; backend {backend.name!r} does not convert ONNX")
    return {"window": window, "segments": segments, "cuts": list(cuts or []) or None}


def _check_numbers(threshold: float | None, max_samples: int) -> None:
    if threshold is None:  # the scheme's default
        pass
    elif not isinstance(threshold, (int, float)) or not math.isfinite(threshold) or not -1 <= threshold <= 1:
        raise InputError(f"--threshold is a minimum cosine between -1 and 1, got {threshold}")
    if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1:
        raise InputError(f"--max-samples must be a positive integer, got {max_samples}")


def check_tokenizer(hf_dir: Path) -> None:
    """A tokenizer.json the tokenizers library cannot read is refused before any export."""
    if (hf_dir / "tokenizer.json").is_file():
        run_bundle.load_tokenizer(hf_dir / "tokenizer.json", DEFAULT_SEQ)


def _cache_key(src, b, scheme, shapes, backend, calib_samples, held, options) -> str:
    return cache.key({
        "model": src.sha256, "board": b.name, "target": board_target(b), "scheme": scheme, "shapes": shapes,
        **cache.made_by(backend),
        "calibration": calibration.fingerprint(calib_samples),
        "golden": calibration.fingerprint(held), "options": options,
    })
