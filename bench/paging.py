"""Layer-paged execution against the monolithic model (edgeinfer.run.paged).

all-MiniLM-L6-v2 (dynamic axes) split into its 6 layers; each configuration runs in its own
process so that peak RSS belongs to it alone. Measured per configuration: steady-state time per
run, page-in time per segment, the stall (time the run waited for a segment) and hence the
fraction of page-in time prefetch hid, resident bytes as accounted (artifact bytes of loaded
segments) against the planner-side prediction (``paging.plan_paging`` on the segments' weight
bytes), and the process's RSS growth.

    python bench/paging.py            # onnxruntime, and OpenVINO CPU when installed
    python bench/paging.py --quick    # fewer runs
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RssSampler, arguments, rss  # noqa: E402

SEQ = 128


def child(cfg: dict) -> dict:
    """One configuration, in its own process: paged runs, then the monolithic model in the same
    process, alternating blocks (PPMMPPMM) so that a busy machine slows both alike."""
    import numpy as np

    from edgeinfer.contract import registry as plugins
    from edgeinfer.run import paged as paged_mod
    from edgeinfer.testing import minilm

    if cfg.get("dim"):  # the synthetic deep stack
        feeds = {"x": np.random.default_rng(0).standard_normal((cfg["batch"], cfg["dim"])).astype(np.float32)}
    else:
        feeds = minilm.tokenize(minilm.sentences()[: cfg["batch"]], seq=SEQ)
    be = plugins.get_backend(cfg["backend"])
    opts = cfg.get("options", {})
    base = rss()
    sampler = RssSampler()
    t = time.perf_counter()
    if cfg["window"] is None:
        sess = be.load(cfg["mono"], **opts)
    else:
        sess = paged_mod.PagedSession.from_artifacts(be, cfg["artifacts"], window=cfg["window"],
                                                  prefetch=cfg["prefetch"], **opts)
    open_s = time.perf_counter() - t
    out = sess.run(feeds)  # warm-up (and, paged, the first pass through the window)
    paged = hasattr(sess, "wait_prefetch")
    if paged:
        sess.wait_prefetch()
        sess.reset_stats()

    def block(s) -> list[float]:
        ts = []
        for _ in range(cfg["runs"]):
            t = time.perf_counter()
            s.run(feeds)
            ts.append(time.perf_counter() - t)
        return ts

    times = block(sess)
    res: dict = {"open_s": round(open_s, 3), "rss_growth_bytes": sampler.stop() - base}
    if paged:
        mono = be.load(cfg["mono"], **opts)
        ref = mono.run(feeds)
        res["same_output"] = bool(np.array_equal(out[next(iter(out))], ref[next(iter(ref))]))
        mono_times = block(mono)
        times += block(sess)
        mono_times += block(mono)
        mono.close()
        res["mono_run_ms_median"] = round(1e3 * sorted(mono_times)[len(mono_times) // 2], 2)
        res["slowdown_vs_monolithic"] = round(sum(times) / sum(mono_times), 3)
        sess.wait_prefetch()
    res["run_ms"] = [round(1e3 * x, 2) for x in times]
    res["run_ms_median"] = round(1e3 * sorted(times)[len(times) // 2], 2)
    if paged:
        st = sess.stats()
        res["paging"] = {k: st[k] for k in ("window", "prefetch", "resident_prefix", "page_ins", "prefetched",
                                            "page_in_ms_mean", "page_in_ms_total", "compute_ms_mean",
                                            "stall_ms_total", "hidden_fraction", "peak_resident_bytes",
                                            "peak_resident_segments", "segment_bytes", "notes")}
        res["paging"]["page_ins_per_run"] = round(st["page_ins"] / max(1, st["runs"]), 2)
    sess.close()
    return res


def deep_stack(path: Path, layers: int = 12, dim: int = 1024, seed: int = 0) -> Path:
    """The shared synthetic stack, wide: little weight per FLOP at large batch (compute-heavy
    segments), almost none at batch 1."""
    from edgeinfer.testing.models import deep_stack as build

    return build(path, layers=layers, dim=dim, batch="b", seed=seed)


def summarize(rows: list[dict], n: int) -> None:
    """Fraction of the page-in cost prefetch really hid, per row:

        hidden = 1 - (T_row - T_resident) / (loads per run x in-line page-in per load)

    where T_resident is the same split with every segment resident (W=n, no page-ins) and the
    in-line page-in is measured at W=1 without prefetch for the same batch. Each time is
    normalised by the monolithic time measured alongside it (the machine is shared), so
    T_row - T_resident = (slowdown_row - slowdown_resident) x T_mono. A background load that
    slows the running segment down (same CPU cores) counts as not hidden."""
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch and r["window"] is not None]
        res = next(r for r in mine if r["window"] == n)
        w1 = next(r for r in mine if r["window"] == 1)
        inline_ms = w1["paging"]["page_in_ms_total"] / max(1, w1["paging"]["page_ins"])
        for r in mine:
            loads = r["paging"]["page_ins_per_run"]
            cost = loads * inline_ms
            extra = (r["slowdown_vs_monolithic"] - res["slowdown_vs_monolithic"]) * r["mono_run_ms_median"]
            r["inline_page_in_ms_per_load"] = round(inline_ms, 2)
            r["page_in_cost_ms_per_run"] = round(extra, 2)
            r["inline_page_in_ms_per_run"] = round(cost, 2)
            r["hidden_fraction_vs_inline"] = round(1 - extra / cost, 3) if cost > 0 else None


def run_child(cfg: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed for {cfg}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(quick: bool = False) -> None:
    import _common

    from edgeinfer.contract import registry as plugins
    from edgeinfer.planning import paging
    from edgeinfer.run import segments as seg_mod
    from edgeinfer.run import split as split_mod
    from edgeinfer.testing import fixtures

    mono = fixtures._cached_export("minilm-dynamic", None, None)
    backends = ["onnxruntime"]
    if "openvino" in plugins.backend_names() and plugins.get_backend("openvino").probe().available:
        backends.append("openvino")
    work = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-paging-"))
    synth = deep_stack(work / "deep.onnx")
    cases = [
        {"key": "minilm", "model": mono, "segments": 6, "batches": ((1, 4 if quick else 8), (32, 1 if quick else 2)),
         "title": "all-MiniLM-L6-v2 (ONNX, dynamic axes), 6 segments = its 6 layers (segment 0 also holds the "
                  f"embeddings), seq {SEQ}", "dim": None, "backends": backends},
        {"key": "deep_stack", "model": synth, "segments": 6, "batches": ((1, 8), (2048, 2 if quick else 3)),
         "title": "synthetic deep stack: 12 residual MatMul+Add+Relu blocks of 1024x1024 fp32 (4 MiB each), "
                  "6 segments of 2 blocks", "dim": 1024, "backends": ["onnxruntime"]},
    ]
    results: dict = {"note": "each row runs in its own process; paged and monolithic runs alternate in blocks "
                             "within it (the machine is shared); onnxruntime sessions use 1 thread so that a "
                             "background page-in has a core of its own (as a board's DMA/storage would)",
                     "models": {}}
    for case in cases:
        infos = split_mod.split_onnx(case["model"], work / case["key"] / "split", segments=case["segments"])
        weight_bytes = [i.weight_bytes for i in infos]
        n = len(infos)
        out_case: dict = {"title": case["title"], "segment_weight_bytes": weight_bytes, "backends": {}}
        for name in case["backends"]:
            be = plugins.get_backend(name)
            t = time.perf_counter()
            arts = seg_mod.deploy_segments(be, case["model"], work / case["key"] / name, "fp32", None,
                                          segments=case["segments"])
            convert_s = time.perf_counter() - t
            mono_art = be.quantize(case["model"], "fp32", None,
                                   work / case["key"] / f"{name}-mono{be.native_suffixes[0]}")
            rows = []
            opts = {"threads": 1} if name == "onnxruntime" else {}
            for batch, runs in case["batches"]:
                common = {"backend": name, "mono": str(mono_art), "batch": batch, "runs": runs, "options": opts,
                          "dim": case["dim"]}
                ref = run_child({**common, "window": None})
                rows.append({"batch": batch, "window": None, "prefetch": None, **ref})
                for window in (1, 2, 4, n):
                    for prefetch in ((False,) if window in (1, n) else (False, True)):
                        r = run_child({**common, "artifacts": [str(a) for a in arts], "window": window,
                                       "prefetch": prefetch})
                        pred = paging.plan_paging(weight_bytes, window, prefetch=prefetch)
                        r["predicted"] = {"resident_weight_bytes": pred["resident_weight_bytes"],
                                          "streamed_bytes_per_run": pred["streamed_bytes_per_token"],
                                          "loads_per_run": pred["loads_per_token"]}
                        rows.append({"batch": batch, "window": window, "prefetch": prefetch, **r})
                        pf = "on " if prefetch else "off"
                        print(f"{case['key']:10s} {name:11s} b={batch:<4d} W={window} prefetch={pf} "
                              f"{r['run_ms_median']:8.1f} ms/run (mono {r['mono_run_ms_median']:.1f}, x"
                              f"{r['slowdown_vs_monolithic']}), page-ins/run {r['paging']['page_ins_per_run']} "
                              f"(predicted {pred['loads_per_token']}), peak resident "
                              f"{r['paging']['peak_resident_bytes'] / 1e6:.1f} MB (predicted weights "
                              f"{pred['resident_weight_bytes'] / 1e6:.1f} MB), "
                              f"RSS +{r['rss_growth_bytes'] / 1e6:.0f} MB "
                              f"(monolithic +{ref['rss_growth_bytes'] / 1e6:.0f} MB)", file=sys.stderr)
            w1 = next(r for r in rows if r["window"] == 1 and r["batch"] == case["batches"][0][0])
            page_in = {"ms_mean_per_segment": w1["paging"]["page_in_ms_mean"],
                       "basis": f"in-line loads at W=1, batch {w1['batch']} (no prefetch: nothing else running)"}
            summarize(rows, n)
            for r in rows:
                if r["window"] is not None:
                    print(f"{case['key']:10s} {name:11s} b={r['batch']:<4d} W={r['window']} "
                          f"prefetch={'on ' if r['prefetch'] else 'off'} "
                          f"x{r['slowdown_vs_monolithic']} vs monolithic, "
                          f"page-in cost {r['page_in_cost_ms_per_run']} ms/run, in-line page-ins "
                          f"{r['inline_page_in_ms_per_run']} ms/run, hidden {r['hidden_fraction_vs_inline']}",
                          file=sys.stderr)
            out_case["backends"][name] = {"convert_s": round(convert_s, 2), "load_options": opts,
                                          "page_in": page_in, "rows": rows}
        results["models"][case["key"]] = out_case
    _common.write("paging", results)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        ap = arguments(__doc__)
        ap.add_argument("--quick", action="store_true", help="fewer batches per case (a smoke run)")
        main(ap.parse_args().quick)
