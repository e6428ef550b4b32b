"""``edgeinfer run``: one model (file or bundle) on one input."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import click

from edgeinfer.cli.output import console, emit
from edgeinfer.errors import InputError


def parse_inputs(specs: tuple[str, ...]) -> dict[str, Any]:
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


def token_id_limits(model: Path, bundle: Any) -> dict[str, int]:
    """Integer inputs that index an embedding table → its row count (from the ONNX graph,
    else the bundle's tokenizer); empty when the model does not tell."""
    from edgeinfer.planning.models.onnx import index_limits

    if bundle:
        files = [a for a in bundle.artifacts if a.suffix == ".onnx"]
    else:
        files = [model] if model.suffix == ".onnx" else []
    limits: dict[str, int] = {}
    for f in files[:1]:
        limits.update(index_limits(f))
    text = bundle.manifest.text if bundle is not None else None
    if text is not None and "input_ids" not in limits:
        from edgeinfer.run.bundle import load_tokenizer

        limits["input_ids"] = load_tokenizer(bundle.path / text.tokenizer / "tokenizer.json",
                                             text.max_length).get_vocab_size()
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


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--input", "-i", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input tensor.")
@click.option("--text", "-t", "texts", multiple=True, help="Text input (bundles with a tokenizer); repeatable.")
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
) -> None:
    """Run MODEL (a file or a bundle) once on the given inputs or texts."""
    import numpy as np

    from edgeinfer.build.golden import non_finite
    from edgeinfer.run.bundle import Bundle, is_bundle, run_padded
    from edgeinfer.run.loading import load

    if not model.exists():
        raise InputError(f"model file not found: {model}")
    if texts and inputs:
        raise InputError("give either --text or --input, not both")
    if not texts and not inputs:
        raise InputError("nothing to run: pass --input NAME=FILE.npy (or --text for text bundles)")
    if out_dir is not None:
        from edgeinfer.files import check_output_dir

        check_output_dir(out_dir, "--out")
    bundle = Bundle.open(model) if is_bundle(model) else None
    if texts and bundle is None:
        raise InputError("--text needs a bundle with a tokenizer (made by `edgeinfer deploy` from a HF directory)")
    feeds = bundle.tokenize(list(texts)) if texts else parse_inputs(inputs)
    if not texts:
        check_token_ids(feeds, token_id_limits(model, bundle))
    t0 = time.perf_counter()
    if window is not None or segments is not None or cuts:
        from edgeinfer.build.segments import open_paged

        for opt, value in (("--paging", window), ("--segments", segments)):
            if value is not None and value < 1:
                raise InputError(f"{opt} must be at least 1, got {value}")
        if window is None or bundle is not None:
            raise InputError("--segments/--cut go with --paging W on an .onnx model (a paged bundle pages by itself)")
        session = open_paged(model, backend=backend, device=device, window=window, segments=segments,
                             cuts=list(cuts), prefetch=not no_prefetch)
    else:
        from edgeinfer.build.deploy import parse_shapes

        extra = {"shapes": parse_shapes(shapes)} if shapes else {}
        session = load(model, backend=backend, device=device, **extra)
    load_s = time.perf_counter() - t0
    with session:
        t1 = time.perf_counter()
        outputs = run_padded(session, feeds) if bundle else session.run(feeds)
        run_s = time.perf_counter() - t1
    if texts and bundle.manifest.text.pooling != "none":
        outputs = {**outputs, "embeddings": bundle.embed(outputs, feeds)}
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
    for o in report["outputs"]:
        if o["non_finite"]:
            click.echo(f"warning: output {o['name']} holds {o['non_finite']} NaN/Inf values (reported as null in "
                       "--json)",
                       err=True)
    if hasattr(session, "stats"):  # a paged session: page-in times and resident bytes
        report["paging"] = session.stats()
    if "embeddings" in outputs:
        report["embeddings"] = np.round(outputs["embeddings"], 6).tolist()

    def render(r: dict[str, Any]) -> None:
        out = console()
        out.print(f"{r['model']} on {r['backend']} ({r['device']}): run {r['timing_ms']['run']:.1f} ms")
        for o in r["outputs"]:
            out.print(f"  {o['name']}: {o['dtype']} {o['shape']}")
        for i, vec in enumerate(r.get("embeddings", [])):
            head = ", ".join(f"{x:+.4f}" for x in vec[:6])
            out.print(f"  embedding[{i}] ({len(vec)} dims): [{head}, …]")
        for p in r["written"]:
            out.print(f"  wrote {p}")

    emit(report, as_json, render)


# --- deploy / golden / bench ---------------------------------------------------------------------


