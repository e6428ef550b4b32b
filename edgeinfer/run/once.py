"""One model (file or bundle) run once on given tensors or texts: what ``edgeinfer run`` does.

:func:`run_once` picks the session (paged or plain, bundle or file), makes the feeds (``.npy``
files, or texts through a bundle's tokenizer), runs, pools embeddings for text bundles, writes
the outputs and returns the report that ``edgeinfer run --json`` prints. Error messages name the
CLI's options because that is where the values come from.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import InputError, check_text

if TYPE_CHECKING:
    from edgeinfer.contract.backend import Session
    from edgeinfer.model.bundle import Bundle


@dataclass(frozen=True)
class Pairs:
    """A reranker's input: ``--query`` and the ``--document`` texts scored against it."""

    query: str | None
    documents: tuple[str, ...] = ()


@dataclass(frozen=True)
class Paging:
    """``--paging W`` with its ``--segments`` / ``--cut`` and prefetch; ``window`` None = not paged."""

    window: int | None = None
    segments: int | None = None
    cuts: tuple[str, ...] = ()
    prefetch: bool = True

    @property
    def requested(self) -> bool:
        return self.window is not None or self.segments is not None or bool(self.cuts)


def read_feeds(specs: Sequence[str]) -> dict[str, Any]:
    """``NAME=FILE.npy`` pairs → arrays (errors name the bad pair)."""
    import numpy as np

    feeds = {}
    for item in specs:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InputError(f"--input {item!r} is not NAME=FILE.npy")
        if name in feeds:
            raise InputError(f"--input {name} is given twice; give each input once")
        path = Path(file)
        if not path.is_file():
            raise InputError(f"--input {name}: file not found: {path}")
        try:
            arr = np.load(path, allow_pickle=False)  # object arrays raise: nothing is unpickled
        except Exception as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][:160]
            raise InputError(f"--input {name}: {path} is not a readable .npy file ({why})") from None
        if not isinstance(arr, np.ndarray):
            arr.close()
            raise InputError(f"--input {name}: {path} is a .npz archive; pass one .npy array per input")
        feeds[name] = arr
    return feeds


def onnx_index_limits(files: list[Path]) -> dict[str, int]:
    """The embedding-table limits of the first ONNX file of ``files`` (of a bundle: its first artifact), read
    without its weights; empty when there is none."""
    from edgeinfer.planning.models.onnx import index_limits

    onnx = [f for f in files if f.suffix == ".onnx"]
    return index_limits(onnx[0]) if onnx else {}


def token_id_limits(model: Path, bundle: Bundle | None) -> dict[str, int]:
    """Integer inputs that index an embedding table → its row count (from the bundle's manifest or the ONNX
    graph, else the bundle's tokenizer: its vocabulary, and the token types it makes); empty when the model
    does not tell."""
    if bundle and bundle.manifest.index_limits is not None:  # recorded at deploy
        limits = dict(bundle.manifest.index_limits)
    else:
        limits = onnx_index_limits(bundle.artifacts if bundle else [model])
    text = bundle.manifest.text if bundle is not None else None
    types = any(s.name == "token_type_ids" for s in bundle.manifest.inputs) if bundle is not None else False
    if text is not None and ("input_ids" not in limits or (types and "token_type_ids" not in limits)):
        from edgeinfer.run.bundle import load_tokenizer

        tokenizer = load_tokenizer(bundle.path / text.tokenizer / "tokenizer.json", text.max_length)
        limits.setdefault("input_ids", tokenizer.get_vocab_size())
        if types:  # a sentence pair shows every type the tokenizer makes (BERT: 0 and 1)
            limits.setdefault("token_type_ids", max(tokenizer.encode("a", "b").type_ids) + 1)
    return limits


def check_token_ids(feeds: dict[str, Any], limits: dict[str, int]) -> None:
    """Refuse token ids outside [0, vocabulary): a backend would read out of bounds or return garbage."""
    for name, rows in limits.items():
        arr = feeds.get(name)
        if arr is None or arr.dtype.kind not in "iu" or arr.size == 0:
            continue
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= rows:
            bad = lo if lo < 0 else hi
            raise InputError(f"--input {name}: id {bad} is outside the model's vocabulary [0, {rows}); "
                             "pass ids made by the model's tokenizer (or use --text)")


def non_finite(arr: Any) -> int:
    """How many NaN / ±Inf values ``arr`` holds (0 for integer outputs)."""
    import numpy as np

    a = np.asarray(arr)
    return int(a.size - np.count_nonzero(np.isfinite(a))) if a.dtype.kind in "fc" else 0


def write_outputs(outputs: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write every output as ``out_dir/<name>.npy``, all or nothing."""
    import numpy as np

    from edgeinfer.files import temp_dir

    out_dir.mkdir(parents=True, exist_ok=True)
    staged = []
    with temp_dir(out_dir, "outputs") as tmp:
        for name, arr in outputs.items():
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            p = Path(tmp) / f"{safe}.npy"
            np.save(p, arr)
            staged.append((p, out_dir / p.name))
        for src, dst in staged:
            os.replace(src, dst)
    return [dst for _, dst in staged]


def _check_request(model: Path, inputs: Sequence[str], texts: Sequence[str], out_dir: Path | None,
                   pairs: Pairs | None = None) -> None:
    if not model.exists():
        raise InputError(f"model file not found: {model}", kind="model_not_found")
    if pairs is not None and (texts or inputs):
        raise InputError("give either --query with --document (a reranker), --text or --input, not several")
    if texts and inputs:
        raise InputError("give either --text or --input, not both")
    if not texts and not inputs and pairs is None:
        raise InputError("nothing to run: pass --input NAME=FILE.npy (or --text for text bundles, --query and "
                         "--document for rerankers)")
    for t in texts:
        check_text(t, "--text")
    if pairs is not None:
        if pairs.query is None:
            raise InputError("--document needs --query: a reranker scores each document against the query")
        for t in (pairs.query, *pairs.documents):
            check_text(t, "--query / --document")
    if out_dir is not None:
        from edgeinfer.files import check_output_dir

        check_output_dir(out_dir, "--out")


def _feeds(model: Path, bundle: Bundle | None, inputs: Sequence[str], texts: Sequence[str],
           pairs: Pairs | None = None) -> dict[str, Any]:
    task = bundle.manifest.task if bundle is not None else None
    if pairs is not None or (texts and task is not None):
        from edgeinfer.run import scoring

        if bundle is None:
            raise InputError("--query and --document need a reranker bundle (made by `edgeinfer deploy`)")
        if pairs is None:
            scoring.task_of(bundle, "classify")
            return scoring.text_feeds(bundle, list(texts))
        scoring.task_of(bundle, "rerank")
        return scoring.pair_feeds(bundle, pairs.query, list(pairs.documents))
    if not texts:
        feeds = read_feeds(inputs)
        check_token_ids(feeds, token_id_limits(model, bundle))
        return feeds
    if bundle is None:
        raise InputError("--text needs a bundle with a tokenizer (made by `edgeinfer deploy` from a HF directory)")
    from edgeinfer.run.bundle import tokenize_texts

    return tokenize_texts(bundle, list(texts))


def open_session(model: Path, bundle: Bundle | None, backend: str | None, device: str | None,
                 shapes: Sequence[str], paging: Paging) -> Session:
    """A layer-paged session when ``paging`` asks for one (plain ``.onnx`` only), else ``edgeinfer.load``."""
    if not paging.requested:
        from edgeinfer.run.loading import load, parse_shapes

        extra = {"shapes": parse_shapes(tuple(shapes))} if shapes else {}
        return load(model, backend=backend, device=device, **extra)
    from edgeinfer.run.segments import open_paged

    for opt, value in (("--paging", paging.window), ("--segments", paging.segments)):
        if value is not None and value < 1:
            raise InputError(f"{opt} must be at least 1, got {value}")
    if paging.window is None or bundle is not None:
        raise InputError("--segments/--cut go with --paging W on an .onnx model (a paged bundle pages by itself)")
    return open_paged(model, backend=backend, device=device, window=paging.window, segments=paging.segments,
                      cuts=list(paging.cuts), prefetch=paging.prefetch)


def run_once(
    model: Path,
    inputs: Sequence[str] = (),
    texts: Sequence[str] = (),
    backend: str | None = None,
    device: str | None = None,
    out_dir: Path | None = None,
    shapes: Sequence[str] = (),
    paging: Paging = Paging(),
    pairs: Pairs | None = None,
) -> dict[str, Any]:
    """Run ``model`` once; the report: backend, device, each output's name/shape/dtype/non-finite count,
    load and run times, written files, paging stats (paged sessions), embeddings (text bundles), ranked
    documents (rerankers: ``pairs``) or labels (classifiers: ``texts``)."""
    import numpy as np

    from edgeinfer.model.bundle import Bundle
    from edgeinfer.model.kind import Kind, kind
    from edgeinfer.run.bundle import embed
    from edgeinfer.run.padding import run_padded

    _check_request(model, inputs, texts, out_dir, pairs)
    match kind(model, "model file"):
        case Kind.DECODER_DIR | Kind.DECODER_BUNDLE | Kind.DECODER_FILE:
            raise InputError(f"{model} is a language (decoder) model; `edgeinfer run` runs tensor models: "
                             f"use `edgeinfer generate {model} --prompt TEXT`")
        case Kind.ENCODER_BUNDLE:
            bundle = Bundle.open(model)
        case _:
            bundle = None
    feeds = _feeds(model, bundle, inputs, texts, pairs)
    scored = not inputs and bundle is not None and bundle.manifest.task is not None
    if (texts or scored) and bundle.manifest.buckets:  # padding a bucket adds back only what its shape needs
        from edgeinfer.run.buckets import trim

        feeds = trim(feeds)
    t0 = time.perf_counter()
    session = open_session(model, bundle, backend, device, shapes, paging)
    load_s = time.perf_counter() - t0
    with session:
        t1 = time.perf_counter()
        outputs = run_padded(session, feeds) if bundle else session.run(feeds)
        run_s = time.perf_counter() - t1
    if texts and not scored and bundle.manifest.text.pooling != "none":
        outputs = {**outputs, "embeddings": embed(bundle, outputs, feeds)}
    written = write_outputs(outputs, out_dir) if out_dir else []
    report: dict[str, Any] = {
        "model": str(model),
        "backend": session.backend_name,
        "device": session.device,
        "outputs": [
            {"name": k, "shape": list(np.shape(v)), "dtype": np.asarray(v).dtype.name, "non_finite": non_finite(v)}
            for k, v in outputs.items()
        ],
        "timing_ms": {"load": load_s * 1e3, "run": run_s * 1e3},
        "written": [str(p) for p in written],
    }
    if hasattr(session, "counts"):  # a bucketed session: the (batch x seq) buckets it ran
        report["bucket_runs"] = {f"{b}x{s}": n for (b, s), n in sorted(session.counts.items())}
    if hasattr(session, "stats"):  # a paged session: page-in times and resident bytes
        report["paging"] = session.stats()
    if "embeddings" in outputs:
        report["embeddings"] = np.round(outputs["embeddings"], 6).tolist()
    if scored:
        report.update(_scores(bundle, outputs, pairs))
    return report


def _scores(bundle: Bundle, outputs: dict[str, Any], pairs: Pairs | None) -> dict[str, Any]:
    """A reranker's documents best first (``results``), or a classifier's label per text (``predictions``)."""
    from edgeinfer.run import scoring

    task, logits = bundle.manifest.task, scoring.logits(bundle, outputs)
    if pairs is None:
        return {"task": task.kind, "predictions": scoring.labelled(task, logits)}
    return {"task": task.kind, "query": pairs.query,
            "results": [{"index": i, "relevance_score": s, "document": pairs.documents[i]}
                        for i, s in scoring.ranked(scoring.relevance(task, logits))]}
