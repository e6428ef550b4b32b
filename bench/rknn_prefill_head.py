"""Where the rknn decoder's prefill graph runs its LM head, on a model with a real vocabulary.

A 2-layer random Qwen3 (hidden 512) with Qwen's 151,936-token vocabulary, tied embeddings, is converted for
rk3588 (fp16, ctx 256, the default 16-token prefill chunk) and its 64-token prompt prefilled in the
rknn-toolkit2 simulator. Reported per graph: the ops the toolkit's build log says fall back to the CPU
("fallback to cpu"), the logits the prefill graph returns, and the simulator's time for the prompt — a PC
emulating the NPU, NOT a board figure: there a CPU-fallback op runs as host numpy-speed code and an NPU op is
emulated, so a graph that keeps more on the NPU can be slower in the simulator.

    python bench/rknn_prefill_head.py [--label NAME]      # ≈ 2 min; bench/results/rknn_prefill_head[-NAME].json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

CTX = 256
PROMPT_TOKENS = 64


def random_qwen_vocab(out: Path) -> Path:
    import transformers

    from edgeinfer.testing.llm import _save_random

    cfg = transformers.Qwen3Config(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                                   tie_word_embeddings=True, max_position_embeddings=4096)
    return _save_random("Qwen3ForCausalLM", cfg, out, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    import edgeinfer

    backend = edgeinfer.backend("rknn")
    with tempfile.TemporaryDirectory(prefix="rknn-head-") as tmp:
        model = random_qwen_vocab(Path(tmp) / "model")
        art = Path(tmp) / "art"
        t = time.perf_counter()
        backend.quantize_decoder(model, "fp16", CTX, art)
        convert_s = time.perf_counter() - t
        graphs = {log.name.removesuffix(".rknn.log"): log.read_text(errors="replace").count("fallback to cpu")
                  for log in sorted(art.glob("*.rknn.log"))}
        d = backend.load_decoder(art, device="simulator", context=CTX)
        try:
            ids = np.arange(100, 100 + PROMPT_TOKENS, dtype=np.int64)
            times = []
            for _ in range(4):
                d.reset(0)
                t = time.perf_counter()
                logits = d.prefill(0, ids)
                times.append(time.perf_counter() - t)
            out = d.pager.session(0, "prefill").run(dict(zip(
                ["hidden_0", "cos", "sin", "mask"], step_inputs_for(d, ids[:d.chunk])),
                **{f"past_{k}_{i}": np.zeros((1, d.kv_heads, CTX, d.head_dim), np.float32)
                   for i in range(2) for k in "kv"}))
        finally:
            d.close()
    write("rknn_prefill_head" + (f"-{args.label}" if args.label else ""), {
        "model": "random Qwen3, 2 layers, hidden 512, vocab 151936, tied", "scheme": "fp16", "target": "rk3588",
        "context": CTX, "prefill_chunk": d.chunk, "convert_s": round(convert_s, 1),
        "cpu_fallback_ops_per_graph": graphs, "prefill_logits_shape": list(out["logits"].shape),
        "sim_prefill_s": [round(x, 3) for x in times], "prompt_tokens": PROMPT_TOKENS,
        "logits_argmax": int(np.argmax(logits)),
        "label": "simulator on a PC: the fallback counts are the toolkit's build; the times are not a board's"})


def step_inputs_for(d, ids: np.ndarray) -> tuple:
    from edgeinfer_rknn.decoder import step_inputs

    return step_inputs(d.tables, [int(i) for i in ids], 0, d.chunk, d.built_context)


if __name__ == "__main__":
    main()
