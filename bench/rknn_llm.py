"""RKNN decoders in the rknn-toolkit2 simulator (target rk3588): decode calls/s unpaged and layer-paged,
page-in time per segment, measured resident weight bytes, and the planner's predicted board tokens/s.

For each configuration (segments S, window W) the trained test model is converted once (fp16, ctx 64),
opened with the window, prefilled with one prompt and then decoded token by token (greedy); reported:

* ``sim_decode_calls_per_s``: decode steps per second of wall time in the simulator (a PC; NOT board
  speed). In the simulator a page-in takes the segment graph this process has built from host memory
  (edgeinfer_rknn.decoder.SIMULATOR_POOL), so paged figures here are the simulator's compute plus host
  bookkeeping and say nothing about a board's storage/DRAM page-in;
* ``page_in_ms_mean`` per segment and ``page_ins`` over the run: simulator figures, not a board's page-in
  (a graph's first page-in takes the one the conversion just built in this process, later ones take it
  from the pool);
* ``resident_bytes_peak`` (weight bytes of the segments resident at once, measured on the exported
  graphs) and ``kv_cache_bytes``;
* ``prediction``: ``edgeinfer.planning.decoder_paging.plan_paged_decoder`` for rk3588-8g at the same
  S and W — predicted board figures, never measured here. When that module is absent (it is written
  on another branch) the column says so and stays empty.

Run: ``python bench/rknn_llm.py`` (≈ 2–3 min on 2 shared cores). Writes bench/results/rknn_llm.json and
bench/results/rknn_llm.png.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, arguments, write  # noqa: E402

CTX = 64
BOARD = "rk3588-8g"
PROMPT = "The licence grants"
# (segments, window, decode steps)
CONFIGS = [(1, 1, 40), (2, 2, 40), (2, 1, 40), (4, 2, 40)]


def prediction(model: Path, segments: int, window: int) -> dict:
    from edgeinfer.planning.decoder_paging import plan_paged_decoder

    p = plan_paged_decoder(model, BOARD, scheme="fp16", context=CTX, window=window, segments=segments)
    return {"available": True, "label": "prediction (planner, board), not measured",
            **{k: getattr(p, k) for k in ("window", "segments", "segment_bytes", "resident_bytes", "kv_bytes",
                                          "page_in_s_per_token", "compute_s_per_token", "tokens_per_s",
                                          "paged_cost_pct")}}


def run(backend, model: Path, tmp: Path, segments: int, window: int, steps: int) -> dict:
    from edgeinfer.run.generation.text import TextCodec

    out = tmp / f"s{segments}"
    if not out.exists():
        t = time.perf_counter()
        backend.quantize_decoder(model, "fp16", CTX, out, segments=segments)
        convert_s = time.perf_counter() - t
    else:
        convert_s = None
    t = time.perf_counter()
    d = backend.load_decoder(out, device="simulator", context=CTX, window=window)
    open_s = time.perf_counter() - t
    try:
        ids = np.asarray(TextCodec(model).encode(PROMPT), dtype=np.int64)
        logits = d.prefill(0, ids)
        tokens = []
        t = time.perf_counter()
        for _ in range(steps):
            tokens.append(int(np.argmax(logits)))
            logits = d.decode([0], np.asarray([tokens[-1]], dtype=np.int64))[0]
        decode_s = time.perf_counter() - t
        stats = d.paging_stats()
    finally:
        d.close()
    return {"segments": segments, "window": window, "decode_steps": steps, "tokens": tokens,
            "sim_decode_calls_per_s": round(steps / decode_s, 3), "convert_s": convert_s and round(convert_s, 2),
            "open_s": round(open_s, 2), "page_ins": stats["page_ins"], "page_in_ms_mean": stats["page_in_ms_mean"],
            "segment_bytes": stats["segment_bytes"], "resident_bytes_peak": stats["peak_resident_bytes"],
            "kv_cache_bytes": stats["kv_cache_bytes"], "pinned": stats["pinned"], "prefetch": stats["prefetch"],
            "notes": stats["notes"], "prediction": prediction(model, segments, window)}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"S={r['segments']} W={r['window']}" for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].bar(labels, [r["sim_decode_calls_per_s"] for r in rows], color="tab:blue")
    ax[0].set_yscale("log")
    ax[0].set_title("simulator decode calls/s (PC, not board speed)")
    for r, lab in zip(rows, labels):
        ms = [m for m in r["page_in_ms_mean"] if m is not None]
        ax[1].plot(range(len(r["page_in_ms_mean"])), [m if m is not None else np.nan for m in r["page_in_ms_mean"]],
                   marker="o", label=lab) if ms else None
    ax[1].set_title("simulator page-in per segment (host pool, not a board load), ms")
    ax[1].set_yscale("symlog", linthresh=1e-3)
    ax[1].set_xlabel("segment")
    ax[1].legend()
    pred = [r["prediction"].get("tokens_per_s") for r in rows]
    if any(p is not None for p in pred):
        ax[2].bar(labels, [p or 0 for p in pred], color="tab:gray")
        ax[2].set_title(f"PREDICTION: planner board tokens/s ({BOARD})")
    else:
        ax[2].text(0.5, 0.5, "planner prediction not available on this branch", ha="center", va="center")
        ax[2].set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    import torch

    import edgeinfer
    from edgeinfer.testing.llm import model_dir

    torch.set_num_threads(1)
    backend = edgeinfer.backend("rknn")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rknn-llm-") as tmp:
        for segments, window, steps in CONFIGS:
            rows.append(run(backend, model_dir(), Path(tmp), segments, window, steps))
            print(rows[-1]["segments"], rows[-1]["window"], rows[-1]["sim_decode_calls_per_s"], file=sys.stderr)
    same = all(r["tokens"] == rows[0]["tokens"][:len(r["tokens"])] for r in rows)
    write("rknn_llm", {"model": "tiny-qwen3 (trained, 4 layers)", "scheme": "fp16", "target": "rk3588",
                       "context": CTX, "paged_tokens_equal_unpaged": same, "rows": rows,
                       "note": "rknn-toolkit2 2.5.0 simulator on a shared 2-core PC: calls/s and page-in times are "
                               "simulator figures (a page-in takes a graph this process built, from host memory), "
                               "not board speed; 'prediction' columns are the planner's board estimates, not "
                               "measurements"})
    plot(rows, RESULTS / "rknn_llm.png")


if __name__ == "__main__":
    arguments(__doc__).parse_args()
    main()
