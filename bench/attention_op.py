"""The host decoder's attention: onnxruntime's ``com.microsoft.GroupQueryAttention`` against edgeinfer's own
(``edgeinfer.GroupQueryAttention``, plugins/onnxruntime/edgeinfer_onnxruntime/kernels/attention.c), one thread.

  ops        one attention node alone (SmolLM2-135M's shape: 9 query heads, 3 KV heads of 64, a 256-position
             cache), one new token at 32, 96 and 200 positions and 16 rows at 96: onnxruntime's op over an fp16
             cache (fp16 in and out) and over an fp32 one, and the own op (fp32 in and out, fp16 cache); µs a call
  decoders   with ``--bundle B`` (an onnxruntime decoder bundle on the own op): its decoder, and the same graph
             with onnxruntime's op back in place of the own one (the Casts around it, as the conversion wrote it
             before) in a folder beside the bundle whose other files are hard links, so both read one weights file
             through the same page cache (two bundles' files differ in how much of them the page cache holds in 2 MiB
             folios, which moves the matmuls by more than the attention); loaded in one process, alternated:
             ``decode`` of one slot after a 32-token prompt (ms a token), 16 rows at once (ms a step), and
             prompts of 32 and 200 tokens (ms); medians over ``--rounds``
  profile    with ``--bundle``: onnxruntime's profiler on each graph's one-token steps, ms a step per op type
  long       with ``--long BUNDLE`` (one deployed with a larger ``--ctx``): each graph in a fresh process, a prompt
             of the context less 48 tokens; VmRSS after a 32-token prompt and the peak (VmHWM) during the long one

    python bench/attention_op.py [--bundle BUNDLE] [--long BUNDLE] [--rounds 7] [--out NAME]

Writes bench/results/attention_op.json (or NAME.json).
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

H, KVH, D, L = 9, 3, 64, 256


def node_graph(kind: str):
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    half = kind != "onnxruntime fp32 cache"
    q_type = T.FLOAT16 if kind == "onnxruntime fp16 cache" else T.FLOAT
    kv = T.FLOAT16 if half else T.FLOAT
    f = np.arange(L)[:, None] / 10000.0 ** (np.arange(0, D, 2) / D)
    tables = [numpy_helper.from_array(np.cos(f).astype(np.float16 if half else np.float32), "cos"),
              numpy_helper.from_array(np.sin(f).astype(np.float16 if half else np.float32), "sin")]
    inputs = [helper.make_tensor_value_info("qkv", q_type, ["b", 1, (H + 2 * KVH) * D]),
              helper.make_tensor_value_info("pk", kv, ["b", KVH, L, D]),
              helper.make_tensor_value_info("pv", kv, ["b", KVH, L, D]),
              helper.make_tensor_value_info("sl", T.INT32, ["b"]), helper.make_tensor_value_info("tot", T.INT32, [])]
    outputs = [helper.make_tensor_value_info(n, t, None) for n, t in (("o", q_type), ("k", kv), ("v", kv))]
    names = ["qkv", "", "", "pk", "pv", "sl", "tot", "cos", "sin"]
    own = kind == "edgeinfer"
    domain = "edgeinfer" if own else "com.microsoft"
    node = helper.make_node("GroupQueryAttention", names, ["o", "k", "v"], domain=domain, num_heads=H,
                            kv_num_heads=KVH, **({"scale": 0.0} if own else {"do_rotary": 1}))
    g = helper.make_graph([node], "g", inputs, outputs, tables)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def ops(rounds: int) -> dict:
    import numpy as np
    import onnxruntime as ort
    from edgeinfer_onnxruntime import custom_ops

    out: dict = {}
    for kind in ("onnxruntime fp16 cache", "onnxruntime fp32 cache", "edgeinfer"):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.register_custom_ops_library(str(custom_ops.library()))
        sess = ort.InferenceSession(node_graph(kind).SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for rows, length in ((1, 32), (1, 96), (1, 200), (16, 96)):
            kv_type = np.float32 if kind == "onnxruntime fp32 cache" else np.float16
            q_type = np.float16 if kind == "onnxruntime fp16 cache" else np.float32
            k, v = (ort.OrtValue.ortvalue_from_numpy(np.random.randn(rows, KVH, L, D).astype(kv_type)) for _ in "kv")
            b = sess.io_binding()
            b.bind_output("o", "cpu")
            for name, value in (("pk", k), ("pv", v)):
                b.bind_ortvalue_input(name, value)
            for name, value in (("k", k), ("v", v)):
                b.bind_ortvalue_output(name, value)
            b.bind_cpu_input("qkv", np.random.randn(rows, 1, (H + 2 * KVH) * D).astype(q_type))
            b.bind_cpu_input("sl", np.full(rows, length, np.int32))
            b.bind_cpu_input("tot", np.array(length + 1, np.int32))
            calls = 2000 // rows
            times = []
            for _ in range(rounds):
                t = time.perf_counter()
                for _ in range(calls):
                    sess.run_with_iobinding(b)
                times.append((time.perf_counter() - t) / calls * 1e6)
            out.setdefault(kind, {})[f"{rows} row(s) at {length} positions"] = round(statistics.median(times), 1)
            print(f"{kind:24s} {rows:2d} row(s) at {length:3d} positions: {statistics.median(times):7.1f} µs a call")
    return out


def onnxruntime_attention(decoder: Path) -> Path:
    """``decoder`` (a bundle's decoder folder) with each edgeinfer.GroupQueryAttention node replaced by
    com.microsoft.GroupQueryAttention between Casts, in a folder beside the bundle: hard links but for the graph."""
    from edgeinfer_onnxruntime import custom_ops
    from onnx import load, save

    out = decoder.parent.parent / f"{decoder.parent.name}.onnxruntime-attention"  # beside the bundle
    if out.exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir()
    graph_name = json.loads((decoder / "genai_config.json").read_text())["model"]["decoder"]["filename"]
    for f in decoder.iterdir():
        if f.name != graph_name:
            os.link(f, tmp / f.name)
    model = load(str(decoder / graph_name), load_external_data=False)
    custom_ops.onnxruntime_attention(model)
    save(model, str(tmp / graph_name))
    tmp.rename(out)
    return out


def open_decoder(folder: Path, slots: int):
    from edgeinfer_onnxruntime.decoder import OnnxRuntimeDecoder

    return OnnxRuntimeDecoder(folder, L, slots, threads=1)


def decoders(folders: dict[str, Path], rounds: int) -> dict:
    import numpy as np

    one = {k: open_decoder(f, 1) for k, f in folders.items()}
    many = {k: open_decoder(f, 16) for k, f in folders.items()}
    rows: dict = {k: collections.defaultdict(list) for k in folders}
    for _ in range(rounds):
        for k in folders:
            d, dm, r = one[k], many[k], rows[k]
            for n in (32, 200):
                d.reset(0)
                t = time.perf_counter()
                d.prefill(0, np.arange(1, n + 1))
                r[f"prompt of {n} tokens, ms"].append((time.perf_counter() - t) * 1e3)
            d.reset(0)
            tok = int(np.argmax(d.prefill(0, np.arange(1, 33))))
            t = time.perf_counter()
            for _ in range(128):
                tok = int(np.argmax(d.decode([0], np.array([tok]))[0]))
            r["one slot, ms a token"].append((time.perf_counter() - t) * 1e3 / 128)
            for s in range(16):
                dm.reset(s)
            toks = np.argmax(dm.prefill_batch(list(range(16)), [np.arange(1 + s, 33 + s) for s in range(16)]), axis=1)
            t = time.perf_counter()
            for _ in range(32):
                toks = np.argmax(dm.decode(list(range(16)), toks), axis=1)
            r["16 rows, ms a step"].append((time.perf_counter() - t) * 1e3 / 32)
    medians = {k: {m: round(statistics.median(v), 3) for m, v in r.items()} for k, r in rows.items()}
    for k, m in medians.items():
        print(k, m)
    return {"medians": medians, "rounds": {k: dict(r) for k, r in rows.items()}}


def profile(folder: Path, steps: int = 64) -> dict:
    import numpy as np

    d = open_decoder(folder, 1)
    with tempfile.TemporaryDirectory() as tmp:
        sess = d._ort.InferenceSession(d._onnx, d._options(os.path.join(tmp, "ort")),
                                       providers=["CPUExecutionProvider"])
        d.reset(0)
        tok = int(np.argmax(d._run(0, np.arange(1, 33), sess)))
        for _ in range(steps):
            tok = int(np.argmax(d._run(0, np.array([tok]), sess)))
        events = json.loads(Path(sess.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    prompt_end = min(e["ts"] + e["dur"] for e in runs)
    per_op: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > prompt_end:
            per_op[e["args"]["op_name"]] += e["dur"]
    out = {op: round(us / steps / 1e3, 3) for op, us in per_op.most_common()}
    print(folder.name, out)
    return out


LONG = r"""
import json, sys
import numpy as np
from pathlib import Path
from edgeinfer_onnxruntime.decoder import OnnxRuntimeDecoder

def mib(key):
    return next(int(ln.split()[1]) / 1024 for ln in open("/proc/self/status") if ln.startswith(key))

folder, context = Path(sys.argv[1]), int(sys.argv[2])
d = OnnxRuntimeDecoder(folder, context, 1, threads=1)
d.prefill(0, np.arange(1, 33))
open("/proc/self/clear_refs", "w").write("5")  # VmHWM from here
before = mib("VmRSS")
d.reset(0)
d.prefill(0, np.arange(1, context - 47))
print(json.dumps({"prompt_tokens": context - 48, "rss_before_mib": round(before, 1),
                  "peak_mib": round(mib("VmHWM"), 1), "peak_over_before_mib": round(mib("VmHWM") - before, 1)}))
"""


def long_prompt(bundle: Path) -> dict:
    import subprocess

    own = bundle / "decoder"
    context = json.loads((own / "genai_config.json").read_text())["model"]["context_length"]
    out = {}
    for name, folder in (("onnxruntime's op", onnxruntime_attention(own)), ("edgeinfer's op", own)):
        proc = subprocess.run([sys.executable, "-c", LONG, str(folder), str(context)], capture_output=True,
                              text=True, check=True)
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(name, out[name])
    return out


def main() -> None:
    ap = _common.arguments(__doc__)
    ap.add_argument("--bundle", help="an onnxruntime decoder bundle on the own attention op")
    ap.add_argument("--long", help="an onnxruntime decoder bundle deployed with a larger --ctx (e.g. 2048)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="attention_op")
    args = ap.parse_args()
    from edgeinfer_onnxruntime import custom_ops

    if custom_ops.unavailable():
        ap.exit(1, f"attention_op.py: edgeinfer's own ops cannot run here ({custom_ops.unavailable()})\n")
    result = {"threads": 1,
              "shape": {"heads": H, "kv_heads": KVH, "head_size": D, "cache_positions": L},
              "unit": {"ops": "µs a call", "decoders": "ms", "profile": "ms a step"}, "ops": ops(args.rounds)}
    if args.bundle:
        own = Path(args.bundle).expanduser() / "decoder"
        folders = {"onnxruntime's op": onnxruntime_attention(own), "edgeinfer's op": own}
        result["bundle"] = str(Path(args.bundle).expanduser())
        result["decoders"] = decoders(folders, args.rounds)
        result["profile"] = {k: profile(f) for k, f in folders.items()}
    if args.long:
        result["long"] = {"bundle": str(Path(args.long).expanduser()),
                          **long_prompt(Path(args.long).expanduser())}
    _common.write(args.out, result)


if __name__ == "__main__":
    main()
