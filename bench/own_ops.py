"""edgeinfer's own onnxruntime ops (``edgeinfer.MatMulF16``, ``MatMulW8``, ``MatMulW4``) in each build of their
library this CPU runs: AVX-512 (F, BW, VL, VNNI) and AVX2 (with FMA and F16C; what an Intel Core Ultra or an AVX2-only
AMD box gets). The build is pinned with ``EDGEINFER_KERNEL_ISA``, so an AVX-512 machine measures both.

- ``layer``: one graph of ``LAYERS`` weights of K x N (default 1024 x 2816, the peer model's MLP: 176 MiB in fp16,
  past the last-level cache, as a decoder's weights are), each op over the same input, one thread, 1 / 4 / 16
  rows; ms per weight. onnxruntime's own fp32 ``MatMul`` (MLAS) over the same weights is the baseline, and for
  MatMulW4 (w4a16, w4a8: Q4_1 blocks of 32 since 2026-12-06's thirteenth session) onnxruntime's ``MatMulNBits``
  over the builder's int4 of the same weights (symmetric, block 32) at accuracy level 1 (fp32 activations: what
  w4a16 ran on before the own op) and level 4 (int8 activations: w4a8).
- ``decode`` (``--decode``): ``edgeinfer bench BUNDLE --prompt-lengths 32 --new-tokens 64 --threads 1`` on the
  peer bench's host-fp16 and host-w8a16 bundles (the random Qwen3 of ``peer_llamacpp.py``) and its trained 3.9 M
  model's host-w4a16 bundle, a fresh process per run, the builds alternating their order each round.

    python bench/own_ops.py [--k 1024] [--n 2816] [--decode] [--rounds 2] [--out own_ops]

Writes bench/results/<out>.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, write  # noqa: E402

LAYERS = 32
ROWS = (1, 4, 16)
BLOCK = 128
DECODE_PAIRS = ["host-fp16", "host-w8a16", "host-w4a16-q4_0"]
INT4_BLOCK = 32  # the plugin's int4 block (and the builder's)


def layer_graph(weights: list, scheme: str | None):
    """x [M, K] times each weight: a MatMul each (``scheme`` None), or rewritten into ``scheme``'s op."""
    from edgeinfer_onnxruntime import custom_ops
    from onnx import TensorProto, helper, numpy_helper

    k = weights[0].shape[0]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}") for i in range(len(weights))]
    g = helper.make_graph(nodes, "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
                           for i in range(len(weights))],
                          [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    if scheme is not None:  # w4a16 / w4a8: MatMulW4 in Q4_1 blocks of 32, on two digits or one
        custom_ops.use_kernels(model, scheme, INT4_BLOCK if scheme in custom_ops.DIGITS else BLOCK)
    return model


def int4(model, level: int):
    """``model``'s MatMuls as the builder quantizes them to int4 (MatMulNBits, symmetric, block 32) at ``level``."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    q = MatMulNBitsQuantizer(model, block_size=INT4_BLOCK, is_symmetric=True, accuracy_level=level)
    q.process()
    return q.model.model


def time_layers(model, library: str | None, k: int) -> dict[str, float]:
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    if library:
        opts.register_custom_ops_library(library)
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    out = {}
    for rows in ROWS:
        x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
        for _ in range(2):
            s.run(None, {"x": x})
        times = []
        for _ in range(7):
            t = time.perf_counter()
            s.run(None, {"x": x})
            times.append(time.perf_counter() - t)
        out[str(rows)] = round(statistics.median(times) / LAYERS * 1e3, 4)
    return out


def layer(k: int, n: int) -> dict:
    import numpy as np
    from edgeinfer_onnxruntime import custom_ops

    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((k, n)).astype(np.float32) * 0.02 for _ in range(LAYERS)]
    res: dict = {"onnxruntime fp32 MatMul": time_layers(layer_graph(weights, None), None, k)}
    plain = layer_graph(weights, None)
    res["onnxruntime MatMulNBits 4-bit, level 1 (w4a16 before)"] = time_layers(int4(plain, 1), None, k)
    res["onnxruntime MatMulNBits 4-bit, level 4 (w4a8)"] = time_layers(int4(layer_graph(weights, None), 4), None, k)
    for build in custom_ops.ISAS:
        os.environ[custom_ops.ISA_ENV] = build
        if custom_ops.isa() is None:
            res[build] = f"not run: {custom_ops.unavailable()}"
            continue
        lib = str(custom_ops.library())
        for scheme, op in custom_ops.OPS.items():  # MatMulW4 twice: w4a16 (two digits) and w4a8 (one)
            name = f"{op} {scheme}" if list(custom_ops.OPS.values()).count(op) > 1 else op
            res[f"{name} {build}"] = time_layers(layer_graph(weights, scheme), lib, k)
        print(build, {key: v for key, v in res.items() if build in key}, file=sys.stderr)
    os.environ.pop(custom_ops.ISA_ENV, None)
    return res


def decode(rounds: int) -> dict:
    import peer_llamacpp as peer
    from edgeinfer_onnxruntime import custom_ops

    builds = custom_ops.builds()
    out = {}
    for name in DECODE_PAIRS:
        pair = peer.PAIRS[name]
        bundle = peer.edgeinfer_target(pair, peer.model_path(pair.get("model", "random")))
        runs: dict[str, list] = {b: [] for b in builds}
        for r in range(rounds):
            for build in builds if r % 2 == 0 else builds[::-1]:
                cmd = [sys.executable, "-m", "edgeinfer.cli", "bench", str(bundle), "--prompt-lengths", "32",
                       "--new-tokens", "64", "--threads", "1", "--json"]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                      env={**os.environ, custom_ops.ISA_ENV: build})
                res = json.loads(proc.stdout)["results"][0]
                runs[build].append({k: res[k] for k in ("decode_tokens_per_s", "ttft_ms", "peak_rss_bytes")})
                print(name, r, build, runs[build][-1], file=sys.stderr)
        out[name] = {"bundle": bundle.name, "runs": runs,
                     "median_decode_tokens_per_s": {b: statistics.median(x["decode_tokens_per_s"] for x in v)
                                                    for b, v in runs.items()}}
    return out


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--n", type=int, default=2816)
    ap.add_argument("--decode", action="store_true", help="also edgeinfer bench on the peer bundles")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="own_ops")
    args = ap.parse_args()
    data = {"settings": {"k": args.k, "n": args.n, "layers": LAYERS, "threads": 1, "block": BLOCK},
            "layer_ms_per_weight": layer(args.k, args.n)}
    if args.decode:
        data["decode"] = decode(args.rounds)
    write(args.out, data)


if __name__ == "__main__":
    main()
