"""edgeinfer's attention op alone (plugins/onnxruntime/edgeinfer_onnxruntime/kernels/attention.c) over long caches,
fp16 against q8_0, for the head layouts of small decoders, one thread: µs a call, and ns a position of context
(the slope between the shortest and the longest fill). One node, its caches bound in place as the decoder binds
them, one new token a row; the caches are the same random values each time, so the figures are the op's arithmetic
over caches the CPU's caches may hold (the whole decoder's step reads them from memory: bench/kv_q8.py).

``--baseline LIB``: another build of the ops' library (e.g. the one an earlier commit built, copied from
``~/.cache/edgeinfer/kernels/``), timed in turn with this one (A B A B); ratios are this ÷ baseline.

    python bench/attention_cache.py [--rounds 5] [--baseline LIB] [--out NAME]

Writes bench/results/attention_cache.json (or NAME.json).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

SHAPES = {  # query heads, KV heads, head size
    "SmolLM2-135M (9/3 x 64)": (9, 3, 64),
    "peer Qwen3 (16/8 x 64)": (16, 8, 64),
    "Qwen2.5-0.5B (14/2 x 64)": (14, 2, 64),
    "Qwen3-0.6B (16/8 x 128)": (16, 8, 128),
}
L = 4096
FILLS = (256, 1024, 3072)
CACHES = ("fp16", "q8_0")


def node(h: int, kvh: int, d: int, q8: bool):
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    w = d + d // 16 if q8 else d
    kv = T.UINT8 if q8 else T.FLOAT16
    f = np.arange(L)[:, None] / 10000.0 ** (np.arange(0, d, 2) / d)
    tables = [numpy_helper.from_array(np.cos(f).astype(np.float16), "cos"),
              numpy_helper.from_array(np.sin(f).astype(np.float16), "sin")]
    inputs = [helper.make_tensor_value_info("qkv", T.FLOAT, ["b", 1, (h + 2 * kvh) * d]),
              helper.make_tensor_value_info("pk", kv, ["b", kvh, L, w]),
              helper.make_tensor_value_info("pv", kv, ["b", kvh, L, w]),
              helper.make_tensor_value_info("sl", T.INT32, ["b"]), helper.make_tensor_value_info("tot", T.INT32, [])]
    outputs = [helper.make_tensor_value_info(n, t, None) for n, t in (("o", T.FLOAT), ("k", kv), ("v", kv))]
    op = "GroupQueryAttentionQ8" if q8 else "GroupQueryAttention"
    n = helper.make_node(op, ["qkv", "", "", "pk", "pv", "sl", "tot", "cos", "sin"], ["o", "k", "v"],
                         domain="edgeinfer", num_heads=h, kv_num_heads=kvh, scale=0.0)
    g = helper.make_graph([n], "g", inputs, outputs, tables)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("edgeinfer", 1)])


def caches(rows: int, kvh: int, d: int, q8: bool):
    """Random caches: fp16 values, or q8_0 rows (random digits, each block's scale 1/127)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if not q8:
        return [rng.standard_normal((rows, kvh, L, d)).astype(np.float16) for _ in "kv"]
    out = []
    for _ in "kv":
        a = np.empty((rows, kvh, L, d + d // 16), np.uint8)
        a[..., :d] = rng.integers(-127, 128, (rows, kvh, L, d)).astype(np.int8).view(np.uint8)
        a[..., d:] = np.full((rows, kvh, L, d // 32), 1 / 127, np.float16).view(np.uint8)
        out.append(a)
    return out


class Case:
    """One node on one library, bound to its caches; ``call(fill)`` times one step of ``rows`` rows at ``fill``."""

    def __init__(self, library: Path, shape: tuple[int, int, int], q8: bool, rows: int):
        import numpy as np
        import onnxruntime as ort

        h, kvh, d = shape
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.register_custom_ops_library(str(library))
        self.sess = ort.InferenceSession(node(h, kvh, d, q8).SerializeToString(), opts,
                                         providers=["CPUExecutionProvider"])
        self.kv = [ort.OrtValue.ortvalue_from_numpy(a) for a in caches(rows, kvh, d, q8)]
        self.qkv = np.random.default_rng(1).standard_normal((rows, 1, (h + 2 * kvh) * d)).astype(np.float32)
        self.rows = rows

    def time_us(self, fill: int, calls: int) -> float:
        import numpy as np

        b = self.sess.io_binding()
        b.bind_output("o", "cpu")
        for name, value in zip(("pk", "pv"), self.kv):
            b.bind_ortvalue_input(name, value)
        for name, value in zip(("k", "v"), self.kv):
            b.bind_ortvalue_output(name, value)
        b.bind_cpu_input("qkv", self.qkv)
        b.bind_cpu_input("sl", np.full(self.rows, fill, np.int32))
        b.bind_cpu_input("tot", np.array(fill + 1, np.int32))
        self.sess.run_with_iobinding(b)
        t = time.perf_counter()
        for _ in range(calls):
            self.sess.run_with_iobinding(b)
        return (time.perf_counter() - t) / calls * 1e6


def main() -> None:
    ap = _common.arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", type=Path, default=None, help="another build of the ops' library to compare")
    ap.add_argument("--out", default="attention_cache")
    args = ap.parse_args()
    from edgeinfer_onnxruntime import custom_ops

    libraries = {"this": custom_ops.library()}
    if args.baseline:
        if not args.baseline.is_file():
            sys.exit(f"error: no library at {args.baseline}")
        libraries["baseline"] = args.baseline
    steps = [(f, 1) for f in FILLS] + [(FILLS[-1], 4)]
    result: dict = {"threads": 1, "cache_positions": L, "fills": list(FILLS), "isa": custom_ops.isa(),
                    "libraries": {k: str(v) for k, v in libraries.items()}, "us_a_call": {}, "ns_a_position": {}}
    for shape_name, shape in SHAPES.items():
        for cache in CACHES:
            cases = {(lib, rows): Case(path, shape, cache == "q8_0", rows)
                     for lib, path in libraries.items() for rows in (1, 4)}
            runs: dict = {}
            for _ in range(args.rounds):
                for fill, rows in steps:
                    for lib in libraries:  # A B A B
                        calls = max(20, 200_000 // (fill * rows))
                        runs.setdefault(lib, {}).setdefault(f"{rows} row(s) at {fill}", []).append(
                            cases[lib, rows].time_us(fill, calls))
            for lib, r in runs.items():
                med = {k: round(statistics.median(v), 1) for k, v in r.items()}
                result["us_a_call"].setdefault(lib, {}).setdefault(shape_name, {})[cache] = med
                slope = (med[f"1 row(s) at {FILLS[-1]}"] - med[f"1 row(s) at {FILLS[0]}"]) / (FILLS[-1] - FILLS[0])
                result["ns_a_position"].setdefault(lib, {}).setdefault(shape_name, {})[cache] = round(slope * 1e3, 1)
                print(f"{lib:8s} {shape_name:26s} {cache:5s} " + "  ".join(f"{k}: {v:7.1f}" for k, v in med.items())
                      + f"  | {slope * 1e3:6.1f} ns a position", flush=True)
    if args.baseline:
        this, base = result["us_a_call"]["this"], result["us_a_call"]["baseline"]
        result["this_over_baseline"] = {s: {c: {k: round(this[s][c][k] / base[s][c][k], 3) for k in this[s][c]}
                                            for c in this[s]} for s in this}
    _common.write(args.out, result)


if __name__ == "__main__":
    main()
