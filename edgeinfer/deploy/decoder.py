"""``edgeinfer deploy`` of a causal language model: one Hugging Face decoder → a checked decoder bundle.

plan at the asked context (refuse what does not fit, and an architecture the backend does not export:
``Backend.decoders.architectures``) → the board's backend ``convert_decoder``
(cached: :mod:`edgeinfer.contract.cache`) → golden check of the converted decoder against the fp32
transformers reference, greedy (:mod:`edgeinfer.run.generation.golden`; then, where the artifact has decode graphs
for several sequences, the prompts decoded together: :func:`check_batched`) → a sealed bundle
(:mod:`edgeinfer.model.decoder_bundle`). Nothing is written at ``-o`` unless the check passes, or the
backend stamped the artifact ``unchecked`` (a runtime that cannot run on this host, such as RKLLM on x86):
then the bundle says, in its golden report, that the check was not run and why.

Runtime, scheme and context are the plan's (:func:`edgeinfer.planning.decision.decide`, the same for
``edgeinfer plan``): ``runtime`` picks one of the board's runtimes (``edgeinfer plan --runtime``), by
default the board's first that this installation builds; one other than the board's ``backend_runtime`` is
built by the backend that declares it its own (``Decoders.builds``: llama.cpp), else passed to the board's
backend as the decoder convert option ``runtime``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from edgeinfer import files
from edgeinfer.contract import cache, measure, remote_code, seal, stamp
from edgeinfer.contract import registry as plugins
from edgeinfer.contract.backend import Backend, TensorSpec
from edgeinfer.contract.names import DECODER_REFERENCE
from edgeinfer.contract.schemes import normalize_scheme
from edgeinfer.deploy import buckets, conversion_memory, decoder_paging, outdir
from edgeinfer.errors import CheckFailed, InputError
from edgeinfer.model import bundle as bundle_mod
from edgeinfer.model import decoder_bundle
from edgeinfer.model.bundle import Manifest
from edgeinfer.model.kind import Kind, find
from edgeinfer.planning.boards import Board, get_board
from edgeinfer.planning.decision import own_runtime
from edgeinfer.planning.device_memory import check_decoder_fits
from edgeinfer.planning.planner import Plan
from edgeinfer.planning.planner import plan as make_plan
from edgeinfer.progress import Progress
from edgeinfer.run import bundle as run_bundle
from edgeinfer.run.generation import golden

GOLDEN_PROMPTS = 4
GOLDEN_TOKENS = 32
MIN_GOLDEN_TOKENS = 4  # a context too small for this many tokens after the longest prompt is refused
# below this many bytes of weights the fp32 reference runs torch on one thread: its ops are too small to
# share, and on a loaded 2-core host one thread was 18x faster (0.22 s vs 3.9 s, 2 prompts × 32 tokens of
# edgeinfer/testing/data/tiny-qwen3)
ONE_THREAD_BELOW = 64 * 2**20


@dataclass
class DecoderDeployResult:
    bundle: Path
    manifest: Manifest
    golden: dict[str, Any]
    cached: bool  # the conversion was reused from the cache
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    speed_check: dict[str, Any] | None = None  # the golden check's decode speed vs the plan's
    notes: list[str] = field(default_factory=list)  # what was chosen for the user (--paging auto)

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle), "kind": "decoder", "cached": self.cached, "backend": self.manifest.backend,
            "board": self.manifest.board, "scheme": self.manifest.scheme, "runtime": self.manifest.decoder["runtime"],
            "context": self.manifest.decoder["context"], "golden": self.golden, "plan": self.manifest.plan,
            "paging": self.manifest.decoder.get("paging"), "notes": self.notes, "warnings": self.warnings,
            "timings_s": self.timings, "speed_check": self.speed_check, "left_out": self.manifest.left_out,
        }


@remote_code.entry_point
def deploy_decoder(
    model: str | os.PathLike[str],
    board: str | os.PathLike[str] | Board,
    out: str | os.PathLike[str] | None,
    *,
    quant: str | None = None,
    ctx: int | None = None,
    calib: str | os.PathLike[str] | None = None,
    golden_inputs: str | os.PathLike[str] | None = None,
    force: bool = False,
    threshold: float | None = None,
    new_tokens: int = GOLDEN_TOKENS,
    options: dict[str, Any] | None = None,
    runtime: str | None = None,
    progress: Progress | None = None,
    use_cache: bool = True,
    trust_remote_code: bool = False,
    paging: int | str | None = None,
    segments: int | None = None,
    dry_run: bool = False,
    on_plan: Callable[[Plan], None] | None = None,
    board_only: bool = False,
) -> DecoderDeployResult | outdir.DryRun:
    """Deploy the causal LM in ``model`` for ``board``; raise CheckFailed (nothing written) when the plan
    does not fit (unless ``force``) or the golden check fails. Runtime, scheme and context are the plan's
    (:mod:`edgeinfer.planning.decision`): ``on_plan`` is called with it before converting; ``dry_run``
    returns it (:class:`~edgeinfer.deploy.outdir.DryRun`) and converts and writes nothing. ``paging`` (a
    window, or ``"auto"``) with ``segments`` builds it layer-paged (:mod:`edgeinfer.deploy.decoder_paging`),
    golden-checked with that window. ``threshold`` overrides the scheme's minimum logits cosine.
    ``trust_remote_code``: let libraries import the Python files ``model`` names in ``auto_map`` (otherwise
    such a directory is refused before any work). ``board_only``: leave out of the bundle what only the backend's
    simulator on this machine reads (:func:`~edgeinfer.deploy.outdir.leave_out_simulation`), after the golden
    check."""
    progress = progress or Progress(enabled=False)
    warnings: list[str] = []
    notes: list[str] = []
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        outdir.check_out_dir(out_dir)
    elif not dry_run:
        raise InputError("deploy needs -o: the bundle directory to write")
    hf_dir = Path(model)
    if find(hf_dir) is not Kind.DECODER_DIR:
        raise InputError(f"{hf_dir} is not a causal language model directory (config.json names no *ForCausalLM)")
    remote_code.allowed(hf_dir)
    check_text(hf_dir)
    b = get_board(board)
    options = dict(options or {})
    runtime = asked_runtime(runtime, options)
    prompts = golden_prompts(golden_inputs)
    if threshold is not None and not (isinstance(threshold, (int, float)) and -1 <= threshold <= 1):
        raise InputError(f"--threshold is a minimum logits cosine between -1 and 1, got {threshold}")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise InputError(f"new_tokens must be a positive integer, got {new_tokens!r}")
    calibration = read_calibration(calib)

    # 1. plan first (plan's own decision of runtime, scheme and context): refuse what cannot be built here, what
    # does not fit, or an architecture the backend does not export, before converting
    with progress.step(f"planning {hf_dir.name} on {b.name}"):
        chunk = options.get("prefill_chunk")
        chunk = chunk if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0 else None
        plan = make_plan(str(hf_dir), b, quant=quant, ctx=ctx, runtime=runtime, kv_dtype=options.get("kv_dtype"),
                         prefill_chunk=chunk)
        plan.decision.refuse_unbuildable(b)
        backend = plugins.get_backend(plan.decision.chosen.backend or b.backend)  # the runtime's builder
        runtime, scheme, context = plan.runtime, plan.scheme.name, plan.ctx
        paged = decoder_paging.choose(paging, segments, backend, hf_dir, plan, own_runtime(b), notes)
        if paged:  # plan the segmented decoder that is built
            plan = make_plan(str(hf_dir), b, quant=scheme, ctx=context, runtime=runtime, paging=paged.window,
                             segments=paged.segments, kv_dtype=plan.kv_dtype, prefill_chunk=chunk)
            if chunk is None and "prefill_chunk" in backend.decoders.convert_options:
                plan = decoder_paging.adopt_chunk(plan, options, notes)
    if dry_run:
        return outdir.DryRun(plan)
    plan_or_refuse(plan, hf_dir, force, warnings)
    if paged:
        options["segments"] = paged.segments
        notes.append(decoder_paging.note(paged, plan))
    if on_plan:
        on_plan(plan)
    if calibration is not None and scheme in ("fp32", "fp16", "bf16"):
        warnings.append(f"--calib is not used for {scheme}: nothing is quantized")
    asked = options.get("target")
    if asked is not None and str(asked).lower() != str(b.target or b.family).lower():
        warnings.append(f"built for target {asked} (--option target); the plan is {runtime}'s, for target "
                        f"{b.target or b.family}: its speed and memory are that runtime's (to plan another target, "
                        f"pass the board's runtime for it: --runtime {' / '.join(b.runtimes)})")

    if "kv_dtype" in backend.decoders.convert_options:  # the backend builds the plan's KV dtype into its artifact
        options["kv_dtype"] = plan.kv_dtype
    elif backend.decoders.kv_at_load:  # every load passes the manifest's decoder.kv_dtype (run/decoder_load.py)
        options.pop("kv_dtype", None)
    if runtime == own_runtime(b) and "decode_batches" in backend.decoders.convert_options \
            and "decode_batches" not in options:  # static decode shapes: one graph per batch size that fits
        options["decode_batches"], why = buckets.decode_batches(hf_dir, b, scheme, context, runtime)
        progress.note(why)

    # 2. convert (or reuse the cached conversion)
    sha = stamp.sha256_file(hf_dir)
    facts = {"model": sha, "target": b.target or b.family, "scheme": scheme, "context": context,
             **cache.made_by(backend), "options": options, "runtime": runtime,
             "calibration": hashlib.sha256("\n".join(calibration or []).encode()).hexdigest()}
    if backend.decoders.defaults:  # a changed default (an int8 block size ...) is another conversion
        facts["defaults"] = dict(backend.decoders.defaults)
    files.sweep(outdir.tmp_parent(out_dir))
    with files.temp_dir(outdir.tmp_parent(out_dir), "deploy") as tmp:
        work = tmp / "bundle"
        work.mkdir()
        # like the encoder deploy, a backend that declares the option is told the board's target (cpu/gpu/npu,
        # a chip name ...)
        told = {"target": facts["target"]} if "target" in backend.decoders.convert_options else {}
        convert_options = {**told, **options}
        if runtime != own_runtime(b) and runtime in backend.decoders.runtimes:
            convert_options["runtime"] = runtime
        short = conversion_memory.shortfall(plan, paged.segments if paged else 1)
        cached = converted(backend, hf_dir, scheme, context, calibration, convert_options, facts, work, progress,
                           use_cache, short)
        if short and not cached:
            warnings.append(short)
        copy_text_files(hf_dir, work / decoder_bundle.TOKENIZER)

        # 3. golden check against the fp32 reference (unless the artifact cannot run here), then the bundle
        unchecked = (stamp.read(work / decoder_bundle.ARTIFACT) or {}).get("unchecked")
        if unchecked:
            report = golden.not_run(str(unchecked), scheme)
            warnings.append(f"the bundle is written without a golden check: {unchecked}")
            speed = {"skipped": f"no golden check ran, so no decode was timed: {unchecked}"}
        else:
            threads = 1 if plan.breakdown.get("weights", ONE_THREAD_BELOW) < ONE_THREAD_BELOW else None
            report, recorded, timed = check_golden(hf_dir, work, backend, scheme, context, prompts, new_tokens,
                                                   threshold, threads, progress,
                                                   {"window": paged.window} if paged else {}, plan.kv_dtype)
            speed = speed_check(timed, report["device"], plan, b, scheme, runtime, paged)
            if not report["passed"]:
                raise CheckFailed(f"{golden.summary_line(report)} — the bundle was not written "
                                  f"({retry_hint(backend, scheme, options)})", kind="golden_failed",
                                  details={"golden": report})
            decoder_bundle.save_reference(work, recorded)
        manifest = make_manifest(work, hf_dir, sha, b, backend, scheme, context, report, plan, runtime)
        if paged:
            manifest.decoder["paging"] = decoder_paging.manifest_section(paged, plan)
        if board_only:
            outdir.leave_out_simulation(work, backend, manifest)
        bundle_mod.write(work, manifest)
        outdir.replace_dir(work, out_dir)
    return DecoderDeployResult(out_dir, manifest, report, cached, warnings, dict(progress.timings), speed, notes)


# --- the checks before any work ------------------------------------------------------------------------


def check_text(hf_dir: Path) -> None:
    """The tokenizer loads and the chat template (if any) renders: a broken one fails before converting."""
    from edgeinfer.run.generation.text import TextCodec

    codec = TextCodec(hf_dir)
    if codec.chat_template:
        codec.render_chat([{"role": "user", "content": "Hello"}])


def asked_runtime(asked: str | None, options: dict[str, Any]) -> str | None:
    """``--runtime`` or ``--option runtime=`` (the backend's decoder convert option), not both differently."""
    given = options.pop("runtime", None)
    if asked and given is not None and asked != given:
        raise InputError(f"--runtime {asked} and --option runtime={given} disagree; pass one of them")
    return asked or given


def golden_prompts(path: str | os.PathLike[str] | None) -> list[str]:
    """The golden check's prompts: the lines of ``path``, or the packaged ones."""
    src = Path(path) if path else Path(__file__).parents[1] / "data" / "golden_prompts.txt"
    if not src.is_file():
        raise InputError(f"--golden-inputs {src} is not a file; pass a .txt with one prompt a line")
    try:
        lines = [ln.strip() for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except UnicodeDecodeError:
        raise InputError(f"--golden-inputs {src} is not UTF-8 text; pass a .txt with one prompt a line") from None
    if not lines:
        raise InputError(f"--golden-inputs {src} holds no prompts; pass a .txt with one prompt a line")
    return lines[:GOLDEN_PROMPTS] if path is None else lines


def read_calibration(path: str | os.PathLike[str] | None) -> list[str] | None:
    if path is None:
        return None
    p = Path(path)
    if p.suffix.lower() != ".txt" or not p.is_file():
        raise InputError(f"--calib {p}: decoder calibration is a .txt file of text, one sample a line")
    try:
        lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except UnicodeDecodeError:
        raise InputError(f"--calib {p} is not UTF-8 text") from None
    if not lines:
        raise InputError(f"--calib {p} holds no text")
    return lines


def plan_or_refuse(p: Any, hf_dir: Path, force: bool, warnings: list[str]) -> None:
    """Refuse a plan that does not fit (unless ``force``: then a warning)."""
    if p.fits:
        return
    why = "; ".join(p.reasons)
    if not force:
        raise CheckFailed(f"{hf_dir.name} does not fit {p.board.name} with {p.scheme.name} at ctx {p.ctx}: {why}; "
                          f"{suggestion(p)} (see `edgeinfer plan`, or pass --force)")
    warnings.append(f"deploying although the plan says it does not fit: {why}")


def suggestion(p: Any) -> str:
    """The plan's suggestions as one phrase."""
    s = p.suggestions
    tries = []
    if s and s.max_ctx:
        tries.append(f"--ctx {s.max_ctx}")
    if s and s.quant and s.quant != p.scheme.name:
        tries.append(f"--quant {s.quant}")
    if s and s.kv_cache and s.kv_cache["fits"]:
        tries.append(f"--option {s.kv_cache['deploy_option']} (a smaller KV cache)")
    if s and s.board:
        tries.append(f"--board {s.board}")
    return "try " + " or ".join(tries) if tries else "no smaller context or scheme fits this board"


# --- the steps ------------------------------------------------------------------------------------------


def converted(backend: Backend, hf_dir: Path, scheme: str, context: int, calibration: list[str] | None,
              options: dict[str, Any], facts: dict[str, Any], work: Path, progress: Progress,
              use_cache: bool, short: str | None = None) -> bool:
    """Put the backend's decoder artifact and its stamp into ``work``, from the cache
    (``artifacts/<backend>/decoder-<key>``) when an intact entry is there; True when it was. ``short``: a warning
    said before converting (:func:`conversion_memory.shortfall`)."""
    entry = cache.area("artifacts") / backend.name / f"decoder-{cache.key(facts)}" if use_cache else None
    with cache.locked(entry) if entry else contextlib.nullcontext():  # a concurrent deploy of it waits for this one
        if entry is not None and cache.reusable(entry, progress.note):
            progress.note(f"reusing the cached {backend.name} {scheme} conversion of {hf_dir.name}: {entry}")
            shutil.copytree(entry, work, ignore=shutil.ignore_patterns(seal.SEAL), dirs_exist_ok=True)
            return True
        if short:
            progress.note(f"warning: {short}")
        _convert(backend, hf_dir, scheme, context, calibration, options, work, progress, entry)
        return False


def _convert(backend: Backend, hf_dir: Path, scheme: str, context: int, calibration: list[str] | None,
             options: dict[str, Any], work: Path, progress: Progress, entry: Path | None) -> None:
    with progress.step(f"converting {hf_dir.name} to {backend.name} {scheme} for ctx {context}"):
        backend.quantize_decoder(hf_dir, scheme, context, work / decoder_bundle.ARTIFACT, calibration, **options)
    if entry is not None:
        entry.parent.mkdir(parents=True, exist_ok=True)
        try:
            cache.store(entry, work)
        except BaseException:  # interrupted mid-copy: leave no partial entry behind
            files.remove_own(entry.parent)
            raise


def copy_text_files(hf_dir: Path, dst: Path) -> None:
    dst.mkdir()
    for name in decoder_bundle.HF_FILES:
        if (hf_dir / name).is_file():
            shutil.copy2(hf_dir / name, dst / name)


def retry_hint(backend: Backend, scheme: str, options: dict[str, Any]) -> str:
    """What to try after a failed golden check: a less lossy ``--quant``, and for an integer scheme the backend's
    convert options that keep it closer to the reference (``Decoders.closer``) that were not given."""
    closer = backend.decoders.closer if normalize_scheme(scheme).kind == "int" else {}
    return ("try a less lossy --quant" + "".join(f", or {h}" for o, h in closer.items() if o not in options)
            + ", or check the backend's conversion")


def check_golden(hf_dir: Path, work: Path, backend: Backend, scheme: str, context: int, prompts: list[str],
                 new_tokens: int, threshold: float | None, threads: int | None,
                 progress: Progress, load_options: dict[str, Any],
                 kv_dtype: str | None = None) -> tuple[dict, list, tuple[list[Any], int]]:
    """Greedy tokens and logits of the fp32 reference, then of the converted decoder in ``work`` (loaded with
    ``load_options``: a paged one with its window; ``kv_dtype`` too where the backend takes it at load), judged by
    the bounds of ``scheme`` on a ``kv_dtype`` cache (:func:`golden.thresholds_for`); the candidate's
    GenerationMetrics per prompt, and the positions its longest generation reached."""
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec
    from edgeinfer.run.loading import load_generator

    if kv_dtype and backend.decoders.kv_at_load:  # as every load of the bundle will (run/decoder_load.py)
        load_options = {**load_options, "kv_dtype": kv_dtype}

    codec = TextCodec(work / decoder_bundle.TOKENIZER)
    longest = max(len(codec.encode(p)) for p in prompts)
    n = min(new_tokens, context - longest)
    if n < MIN_GOLDEN_TOKENS:
        raise InputError(f"--ctx {context} leaves {max(n, 0)} tokens after the longest golden prompt ({longest} "
                         f"tokens); the golden check needs {MIN_GOLDEN_TOKENS}: use a larger --ctx or shorter "
                         "--golden-inputs")
    recorded = []
    with load_generator(hf_dir, backend=DECODER_REFERENCE, ctx=context, trust_remote_code=remote_code.trusted(),
                        **({"threads": threads} if threads else {})) as reference:
        for p in progress.track(prompts, f"fp32 reference ({DECODER_REFERENCE}): {len(prompts)} prompts × {n} "
                                         "tokens", total=len(prompts)):
            recorded += golden.record(reference, [p], n)
    with progress.step(f"golden check on {backend.name}"):
        check_decoder_fits(backend, work / decoder_bundle.ARTIFACT, None, context, 1, scheme)
        decoder = backend.load_decoder(work / decoder_bundle.ARTIFACT, context=context,
                                       **backend.decoders.logits_options, **load_options)
        metrics: list[Any] = []
        with Generator(decoder, codec) as candidate:
            report = judge(candidate, recorded, n, scheme, golden.thresholds_for(scheme, kv_dtype), threshold,
                           metrics)
    if report["passed"] and (batched := check_batched(backend, work, codec, recorded, report, context, progress,
                                                      load_options)):
        report["batched"] = batched
        report["passed"] = batched.get("passed") is not False
    return report, recorded, (metrics, longest + n)


def check_batched(backend: Backend, work: Path, codec: Any, recorded: list[decoder_bundle.Recorded],
                  report: dict[str, Any], context: int, progress: Progress,
                  load_options: dict[str, Any]) -> dict[str, Any] | None:
    """The golden prompts decoded together (:func:`golden.check_batched`, the single-sequence check's thresholds)
    where the artifact decodes several sequences per call with graphs of their own: the backend converts
    ``decode_batches`` and the stamp's ``max_slots`` is above 1. None elsewhere: nothing more to check."""
    artifact = work / decoder_bundle.ARTIFACT
    most = (stamp.read(artifact) or {}).get("max_slots")
    if "decode_batches" not in backend.decoders.convert_options or not isinstance(most, int) or most < 2:
        return None
    if len(recorded) < 2:
        return {"ran": False, "passed": None, "reason": f"one golden prompt: pass --golden-inputs with 2 to {most} "
                "prompts to check the batched decode graphs"}
    slots = min(len(recorded), most)
    with progress.step(f"batched golden check on {backend.name}: {slots} sequences per decode call"):
        check_decoder_fits(backend, artifact, None, context, slots, report["scheme"])
        try:
            decoder = backend.load_decoder(artifact, context=context, slots=slots, **backend.decoders.logits_options,
                                           **load_options)
        except InputError as e:  # a device that decodes one sequence per call (the RK3588 board path today)
            return {"ran": False, "passed": None, "reason": f"{backend.name} does not open {slots} sequences on this "
                    f"device: {e.one_line()}"}
        try:
            return golden.check_batched(decoder, codec, recorded, report["new_tokens"],
                                        golden.Thresholds(**report["thresholds"]))
        finally:
            decoder.close()


def speed_check(timed: tuple[list[Any], int], device: str, plan: Any, b: Board, scheme: str,
                runtime: str, paged: decoder_paging.Paging | None) -> dict[str, Any]:
    """The golden check's decode tok/s (median over its prompts) against the plan's at the positions it reached."""
    from statistics import median

    from edgeinfer.planning.selfcheck import speed_check as compare

    metrics, positions = timed
    busy = measure.most_busy(m.others_busy_cpus for m in metrics)
    return compare(median(m.decode_tokens_per_s for m in metrics) if metrics else None, device, plan.model, b,
                   scheme, positions, runtime, f"the golden check's greedy decode (logits recorded), median of "
                   f"{len(metrics)} prompts", (paged.window, paged.segments) if paged else None, busy)


def judge(candidate: Any, recorded: list[decoder_bundle.Recorded], new_tokens: int, scheme: str,
          thresholds: golden.Thresholds, min_cosine: float | None,
          metrics: list[Any] | None = None) -> dict[str, Any]:
    """The golden verdict on ``candidate``: what deploy and ``edgeinfer golden`` both return (``metrics``: as
    :func:`golden.record`'s)."""
    if min_cosine is not None:
        thresholds = dataclasses.replace(thresholds, min_cosine=min_cosine)
    report = golden.check_recorded(candidate, recorded, new_tokens, scheme, thresholds=thresholds, metrics=metrics)
    report["ran"], report["device"] = True, candidate.decoder.device
    if candidate.decoder.caveat:  # how it ran here (e.g. a fallback op): scripts read it from the JSON
        report["caveat"] = candidate.decoder.caveat
    return report


@remote_code.entry_point
def golden_bundle(path: str | os.PathLike[str], device: str | None = None,
                  min_cosine: float | None = None, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """Re-run a decoder bundle's golden check here, against the fp32 reference recorded at deploy."""
    b = bundle_mod.Bundle.open(path, verify="full")
    if b.manifest.decoder is None:
        raise InputError(f"bundle {b.path} holds no decoder model")
    before = b.manifest.decoder.get("golden") or {}
    if before.get("ran") is False:
        raise InputError(f"bundle {b.path} holds no fp32 reference to check against: its golden check was not run "
                         f"at deploy ({before.get('reason')})")
    recorded = decoder_bundle.load_reference(b)
    t = golden.thresholds_for(b.manifest.scheme)
    try:
        t = golden.Thresholds(**before["thresholds"])
    except (KeyError, TypeError):
        pass  # a bundle without its report: the scheme's thresholds
    n = before.get("new_tokens") or max(len(r.token_ids) for r in recorded)
    backend = plugins.get_backend(b.manifest.backend)
    with run_bundle.open_generator(b, device=device, trust_remote_code=trust_remote_code,
                                       **backend.decoders.logits_options) as candidate:
        report = judge(candidate, recorded, int(n), b.manifest.scheme, t, min_cosine)
    report["bundle"] = str(b.path)
    return report


def make_manifest(work: Path, hf_dir: Path, sha: str, b: Board, backend: Backend, scheme: str, context: int,
                  report: dict[str, Any], plan: Any, runtime: str) -> Manifest:
    import json

    st = stamp.read(work / decoder_bundle.ARTIFACT) or {}
    cfg = json.loads((hf_dir / "config.json").read_text())
    vocab = int(cfg.get("vocab_size") or 0)
    return Manifest(
        backend=backend.name, versions=st.get("versions", backend.versions()), board=b.name,
        target=st.get("target", b.target or b.family), scheme=scheme, artifacts=[decoder_bundle.ARTIFACT],
        inputs=[TensorSpec("input_ids", (1, "tokens"), "int64")],
        outputs=[TensorSpec("logits", (1, "tokens", vocab), "float32")],
        source={"name": hf_dir.name, "sha256": sha, "kind": "hf"}, plan=outdir.plan_summary(plan),
        decoder={"kind": "causal_lm", "architecture": (cfg.get("architectures") or [""])[0], "context": context,
                 "vocab_size": vocab, "runtime": runtime, "kv_dtype": plan.kv_dtype,
                 "tokenizer": decoder_bundle.TOKENIZER, "golden": report,
                 "golden_reference": decoder_bundle.REFERENCE if report.get("ran") else None},
        requires=outdir.requires(backend, decoder=True, text=True),
    )
