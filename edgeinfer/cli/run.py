"""``edgeinfer run``: one model (file or bundle) on one input; a shell over edgeinfer.run.once.run_once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgeinfer.cli.output import console, emit


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--input", "-i", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input tensor.")
@click.option("--text", "-t", "texts", multiple=True,
              help="Text input (bundles with a tokenizer: embeddings, or a classifier's labels); repeatable.")
@click.option("--query", "-q", help="Rerankers: the query the documents are scored against.")
@click.option("--document", "documents", multiple=True, help="Rerankers: a document to score; repeatable.")
@click.option("--documents", "documents_file", type=click.Path(path_type=Path, allow_dash=True), metavar="FILE",
              help="Rerankers: documents to score, one per line ('-': stdin).")
@click.option("--backend", "-b", help="Backend to run on (default: the model's native backend).")
@click.option("--device", "-d", help="Device of the backend (e.g. CPU, NPU).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Write outputs as DIR/<name>.npy.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=1x128",
              help="Static input shape when the model is converted first (for backends with static shapes); "
                   "repeatable.")
@click.option("--paging", "window", type=int, metavar="W", help="Run layer-paged: keep at most W segments loaded.")
@click.option("--segments", type=int, metavar="N", help="With --paging: split into N segments at layer boundaries.")
@click.option("--cut", "cuts", multiple=True, metavar="TENSOR",
              help="With --paging: cut at this tensor (repeatable).")
@click.option("--no-prefetch", is_flag=True, help="With --paging: load segments in line, not in the background.")
def run(
    model: Path,
    inputs: tuple[str, ...],
    texts: tuple[str, ...],
    backend: str | None,
    device: str | None,
    out_dir: Path | None,
    as_json: bool,
    shapes: tuple[str, ...] = (),
    window: int | None = None,
    segments: int | None = None,
    cuts: tuple[str, ...] = (),
    no_prefetch: bool = False,
    query: str | None = None,
    documents: tuple[str, ...] = (),
    documents_file: Path | None = None,
) -> None:
    """Run MODEL (a file or a bundle) once on the given inputs or texts.

    \b
    A reranker bundle scores documents against a query and lists them best first:
      edgeinfer run RERANKER --query "how do I sort a list" --documents docs.txt
    A classifier bundle gives each --text its label and score.
    """
    from edgeinfer.run.once import Paging, Pairs, run_once

    paging = Paging(window=window, segments=segments, cuts=cuts, prefetch=not no_prefetch)
    if documents_file is not None:
        documents = (*documents, *_lines(documents_file))
    pairs = Pairs(query, tuple(documents)) if query is not None or documents or documents_file else None
    report = run_once(model, inputs=inputs, texts=texts, backend=backend, device=device, out_dir=out_dir,
                      shapes=shapes, paging=paging, pairs=pairs)
    for o in report["outputs"]:
        if o["non_finite"]:
            click.echo(f"warning: output {o['name']} holds {o['non_finite']} NaN/Inf values (reported as null in "
                       "--json)", err=True)
    emit(report, as_json, _render)


def _render(r: dict[str, Any]) -> None:
    out = console()
    out.print(f"{r['model']} on {r['backend']} ({r['device']}): run {r['timing_ms']['run']:.1f} ms")
    for o in r["outputs"]:
        out.print(f"  {o['name']}: {o['dtype']} {o['shape']}")
    for i, vec in enumerate(r.get("embeddings", [])):
        head = ", ".join(f"{x:+.4f}" for x in vec[:6])
        out.print(f"  embedding[{i}] ({len(vec)} dims): [{head}, …]")
    for rank, d in enumerate(r.get("results", []), 1):
        out.print(f"  #{rank} document[{d['index']}] {d['relevance_score']:.4f}  {_short(d['document'])}")
    for i, p in enumerate(r.get("predictions", [])):
        out.print(f"  text[{i}]: {p['label']} {p['score']:.4f}")
    for p in r["written"]:
        out.print(f"  wrote {p}")


def _lines(path: Path) -> list[str]:
    """The non-empty lines of ``--documents FILE`` (``-``: stdin), stripped; undecodable bytes are kept as
    surrogate escapes for the text check to name."""
    import sys

    from edgeinfer.errors import InputError

    if str(path) == "-":
        text = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    else:
        try:
            text = path.read_bytes().decode("utf-8", "surrogateescape")
        except OSError as e:
            raise InputError(f"--documents: cannot read {path} ({e.strerror or e})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
