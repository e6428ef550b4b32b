"""Which INT8 form of the peer bench's random Qwen3 (188 M parameters) the OpenVINO CPU plugin decodes fastest while
deploy's golden check still passes (issue 30, one stream of ``ov-w8a16``): asymmetric blocks (u8, fp16 scale, u8
zero point: the plugin's ``int8_blocks``) and symmetric ones (i8 and a scale, as llama.cpp's Q8_0), per block size.

For each form: ``deploy`` of the model for ``core-ultra-155h --runtime openvino-cpu --quant w8a16``, for its golden
check's verdict (4 prompts x 32 tokens against the fp32 reference; the symmetric forms through the same deploy with
the plugin's writer swapped in this process), and the plugin's conversion alone (``convert_decoder``, no check),
timed with GenAI's ContinuousBatchingPipeline on the CPU at one thread (f32 inference, f16 KV cache), all forms
loaded at once and run in turn, ``--rounds`` times: one stream's ms a token (64 new tokens less 1, after a
32-token prompt) and a 16-row step's ms (32 new tokens less 1). Medians over the rounds.

    python bench/openvino_int8_forms.py [--forms asym128,asym256,sym256] [--rounds 6]

Writes bench/results/openvino_int8_forms.json.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

FORMS = ["asym128", "asym256", "asym512", "sym128", "sym256"]
FORM = re.compile(r"(asym|sym)(\d+)")
PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f16", "INFERENCE_NUM_THREADS": 1}


def symmetric(block: int):
    """``int8_blocks.compress`` writing i8 blocks with a scale only (``max |w| / 127``): the bench's own form."""
    import numpy as np
    from edgeinfer_openvino import int8_blocks
    from openvino import Type
    from openvino import opset13 as ops

    def compress(model, _block: int) -> dict:
        count = 0
        for node in model.get_ordered_ops():
            if not int8_blocks._eligible(node):
                continue
            w = node.get_data().astype(np.float32)
            n, k = w.shape
            g = w.reshape(n, k // int8_blocks.row_block(k, block), -1)
            scale = (np.abs(g).max(axis=2, keepdims=True) / 127.0).astype(np.float16)
            scale[scale == 0] = 1.0
            q = np.clip(np.round(g / scale.astype(np.float32)), -127, 127).astype(np.int8)
            deq = ops.multiply(ops.convert(ops.constant(q), Type.f16), ops.constant(scale))
            deq = ops.reshape(deq, ops.constant(np.array([n, k], dtype=np.int64)), special_zero=False)
            out = ops.convert(deq, Type.f32).output(0)
            for target in list(node.output(0).get_target_inputs()):
                target.replace_source_output(out)
            count += 1
        return {"method": "int8 blocks, symmetric (bench)", "mode": "int8_sym", "group_size": block, "weights": count}

    return compress


def parse(form: str) -> tuple[str, int]:
    """``"asym256"`` -> ``("asym", 256)``."""
    kind, block = FORM.fullmatch(form).groups()
    return kind, int(block)


@contextlib.contextmanager
def writer(form: str, fresh_cache: bool = False):
    """The plugin's INT8 writer for ``form`` (``fresh_cache``: deploy's conversion cache, keyed by the plugin's
    code and options, would hand a symmetric form the asymmetric conversion: an empty one instead)."""
    from edgeinfer_openvino import int8_blocks

    kind, block = parse(form)
    if kind == "asym":
        yield
        return
    saved, env = int8_blocks.compress, os.environ.get("EDGEINFER_CACHE_DIR")
    int8_blocks.compress = symmetric(block)
    with tempfile.TemporaryDirectory(prefix="int8-forms-cache-") as cache:
        if fresh_cache:
            os.environ["EDGEINFER_CACHE_DIR"] = cache
        try:
            yield
        finally:
            int8_blocks.compress = saved
            if env is None:
                os.environ.pop("EDGEINFER_CACHE_DIR", None)
            else:
                os.environ["EDGEINFER_CACHE_DIR"] = env


def verdict(model: Path, form: str, out: Path) -> dict:
    """The golden check's verdict for ``form``, from a deploy into ``out``."""
    import json

    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.errors import EdgeInferError

    try:
        with writer(form, fresh_cache=True):
            deploy_decoder(model, "core-ultra-155h", out, quant="w8a16", ctx=256, force=True,
                           runtime="openvino-cpu", options={"group_size": parse(form)[1]})
    except EdgeInferError as e:
        return {"passed": False, "error": str(e)[:400]}
    golden = json.loads((out / "manifest.json").read_text())["decoder"]["golden"]
    return {"passed": True, "token_agreement": golden["forced_agreement"], "cosine_min": golden["cosine_min"]}


def build(model: Path, form: str, out: Path) -> Path:
    """``form``'s decoder directory, converted by the plugin without a check."""
    import edgeinfer

    with writer(form):
        edgeinfer.backend("openvino").convert_decoder(model, "w8a16", 256, out, target="cpu",
                                                      group_size=parse(form)[1])
    return out


def timings(dirs: dict[str, Path], rounds: int) -> dict[str, dict]:
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    pipes = {}
    for form, path in dirs.items():
        s = og.SchedulerConfig()
        s.num_kv_blocks, s.max_num_seqs, s.max_num_batched_tokens = 0, 16, 256
        s.dynamic_split_fuse, s.enable_prefix_caching = True, False
        pipes[form] = og.ContinuousBatchingPipeline(str(path), s, "CPU", PROPERTIES)
    ids = ov.Tensor(np.arange(5, 37, dtype=np.int64)[None])

    def run(pipe, new: int, rows: int) -> float:
        g = pipe.get_config()
        g.max_new_tokens, g.ignore_eos = new, True
        t = time.perf_counter()
        pipe.generate([ids] * rows, [g] * rows)
        return time.perf_counter() - t

    ms: dict[str, dict[str, list]] = {f: {"one_stream_ms_per_token": [], "rows16_ms_per_step": []} for f in pipes}
    for pipe in pipes.values():  # warm-up: the plugin packs its weights for both kinds of step
        run(pipe, 4, 1)
        run(pipe, 4, 16)
    for _ in range(rounds):
        for form, pipe in pipes.items():
            ms[form]["one_stream_ms_per_token"].append((run(pipe, 65, 1) - run(pipe, 1, 1)) / 64 * 1e3)
            ms[form]["rows16_ms_per_step"].append((run(pipe, 33, 16) - run(pipe, 1, 16)) / 32 * 1e3)
    return {f: {k: {"median": round(statistics.median(v), 2), "rounds": [round(x, 2) for x in v]}
                for k, v in m.items()} for f, m in ms.items()}


def main() -> None:
    import peer_llamacpp

    p = _common.arguments(__doc__)
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    forms = args.forms.split(",")
    bad = [f for f in forms if not FORM.fullmatch(f)]
    if bad:
        p.error(f"unknown form {bad[0]!r}: asymN or symN (N: the block)")
    model = peer_llamacpp.model_path("random")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="int8-forms-") as tmp:
        for form in forms:
            rows[form] = verdict(model, form, Path(tmp) / f"{form}-bundle")
            print(form, rows[form], flush=True)
        times = timings({f: build(model, f, Path(tmp) / f) for f in forms}, args.rounds)
    for form, t in times.items():
        rows[form].update(t)
        print(form, t["one_stream_ms_per_token"]["median"], t["rows16_ms_per_step"]["median"])
    _common.write("openvino_int8_forms", {"model": model.name, "properties": PROPERTIES, "rounds": args.rounds,
                                          "rows": rows})


if __name__ == "__main__":
    main()
