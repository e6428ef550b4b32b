"""RKNN decoder, several sequences at once: aggregate decode tokens/s at 1, 4 and 8 streams in the rknn-toolkit2
simulator, with the planner's board prediction for the same model, context and batch next to it.

The trained test model (edgeinfer/testing/data/tiny-qwen3) is converted once (fp16, ctx 64, one segment,
decode graphs for 1, 4 and 8 sequences: convert option ``decode_batches``) and opened with 8 slots. For each
stream count N: N prompts are prefilled (one slot each), then ``STEPS`` greedy decode steps run with all N
slots in one ``decode`` call (the [B,1] graph of the smallest built B ≥ N). Reported per N:

* ``sim_tokens_per_s``: N × steps / wall time of the decode steps — **simulator figures on a PC, not board
  speed**; ``sim_tokens_per_s_one_call_per_slot``: the same steps run as N calls of the [1,1] graph (what
  ``decode`` did before the batched graphs), for the speedup the batched graph gives in the simulator;
* ``tokens_equal_alone``: each stream's greedy tokens equal those of the same prompt decoded alone;
* ``prediction``: ``edgeinfer.planning.planner.plan(model, "rk3588-8g", fp16, ctx, batch=N, runtime="rknn")``'s
  decode tokens/s — the planner's **board prediction**, never measured here.

Run: ``python bench/rknn_decode_slots.py`` (≈ 1 min on 2 shared cores). Writes bench/results/rknn_decode_slots.json.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, write  # noqa: E402

CTX = 64
BOARD = "rk3588-8g"
STREAMS = (1, 4, 8)
STEPS = 24
PROMPTS = ["The licence grants", "Permission is hereby granted", "def main():", "THE SOFTWARE IS PROVIDED",
           "Copyright (c) the authors", "You may obtain a copy", "import numpy as np", "Redistribution and use"]


def prediction(model: Path, streams: int) -> dict:
    from edgeinfer.planning.planner import plan

    est = plan(str(model), BOARD, quant="fp16", ctx=CTX, batch=streams, runtime="rknn").estimates
    return {"label": f"prediction (planner, {BOARD} board), not measured", "decode_tokens_per_s":
            est.decode_tokens_per_s, "basis": est.basis}


def decode(d, slots: list[int], prompts: list[list[int]], one_call: bool) -> tuple[list[list[int]], float]:
    """Greedy: prefill each prompt into its slot, then STEPS decode steps; (tokens per slot, decode seconds)."""
    tokens = []
    for s, p in zip(slots, prompts):
        d.reset(s)
        tokens.append([int(np.argmax(d.prefill(s, np.asarray(p, dtype=np.int64))))])
    t = time.perf_counter()
    for _ in range(STEPS):
        last = np.asarray([x[-1] for x in tokens], dtype=np.int64)
        if one_call:
            out = d.decode(slots, last)
        else:
            out = np.concatenate([d.decode([s], last[i:i + 1]) for i, s in enumerate(slots)])
        for x, row in zip(tokens, out):
            x.append(int(np.argmax(row)))
    return tokens, time.perf_counter() - t


def main() -> None:
    import torch

    import edgeinfer
    from edgeinfer.run.generation.text import TextCodec
    from edgeinfer.testing.llm import model_dir

    torch.set_num_threads(1)
    backend = edgeinfer.backend("rknn")
    codec = TextCodec(model_dir())
    prompts = [codec.encode(p) for p in PROMPTS]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rknn-slots-") as tmp:
        t = time.perf_counter()
        art = backend.quantize_decoder(model_dir(), "fp16", CTX, Path(tmp) / "dec",
                                       decode_batches=",".join(map(str, STREAMS)))
        convert_s = time.perf_counter() - t
        d = backend.load_decoder(art, device="simulator", context=CTX, slots=max(STREAMS))
        try:
            alone = [decode(d, [0], [p], True)[0][0] for p in prompts]
            for n in STREAMS:
                slots = list(range(n))
                got, batched_s = decode(d, slots, prompts[:n], True)
                _, each_s = decode(d, slots, prompts[:n], False)
                rows.append({"streams": n, "decode_steps": STEPS, "graph_batch": min(b for b in STREAMS if b >= n),
                             "sim_tokens_per_s": round(n * STEPS / batched_s, 2),
                             "sim_tokens_per_s_one_call_per_slot": round(n * STEPS / each_s, 2),
                             "tokens_equal_alone": got == alone[:n], "prediction": prediction(model_dir(), n)})
                print(n, rows[-1]["sim_tokens_per_s"], rows[-1]["sim_tokens_per_s_one_call_per_slot"],
                      rows[-1]["prediction"]["decode_tokens_per_s"], file=sys.stderr)
        finally:
            d.close()
    write("rknn_decode_slots", {
        "model": "tiny-qwen3 (trained, 4 layers)", "scheme": "fp16", "target": "rk3588", "context": CTX,
        "convert_s": round(convert_s, 1), "rows": rows,
        "note": "sim_* are rknn-toolkit2 simulator figures on a shared 2-core PC, not board speed; 'prediction' is "
                f"the planner's {BOARD} estimate for the same model, context and batch, not a measurement"})


if __name__ == "__main__":
    arguments(__doc__).parse_args()
    main()
