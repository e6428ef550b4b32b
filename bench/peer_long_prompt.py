"""Time to the first token of long prompts: ``edgeinfer serve`` against ``llama-server`` on the same model.

bench/peer_llamacpp.py times 32-token prompts; a retrieval or chat prompt is hundreds to thousands of tokens,
where the prefill's matrices and its attention over the prompt decide the wait. Per pair of bench/peer_llamacpp.py
(its model and GGUF; the edgeinfer side deployed for ``--ctx`` by its ``edgeinfer_target``): both servers at once
on loopback, ``--threads`` CPU threads each, 2 slots of ``--ctx`` positions; per round and prompt length one
streamed ``/v1/completions`` request to each, A then B, of a prompt neither has seen (a new text each time:
llama-server keeps a slot's prompt cache), 8 new tokens, greedy. TTFT = send → first text chunk; the median over
rounds, and edgeinfer ÷ llama.cpp (below 1: edgeinfer first). The pairs of a trained model: the random Qwen3's
first 8 tokens can be pieces of one character, no text yet.

    python bench/peer_long_prompt.py [--pairs smol-host-w8a16,smol-host-fp16] [--prompts 512,1500] [--ctx 2048]
        [--rounds 3] [--threads 1] [--out NAME]

Writes bench/results/peer_long_prompt.json.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _llamacpp  # noqa: E402
import _peer  # noqa: E402
import peer_llamacpp as peer  # noqa: E402
from _common import arguments, write  # noqa: E402

WORDS = ("the river city morning village children market winter music garden school story mountain light road "
         "summer bread window letter friend").split()
NEW_TOKENS = 8


def prompt(tokenizer, n: int, seed: int) -> str:
    """A text of about ``n`` tokens, different for each ``seed``."""
    words = " ".join(WORDS[(seed * 7 + k * 3 + k // 20) % len(WORDS)] for k in range(n + seed))
    return tokenizer.decode(tokenizer.encode(words).ids[:n])


def measure(name: str, lengths: list[int], args) -> dict:
    from tokenizers import Tokenizer

    pair = peer.PAIRS[name]
    model = peer.model_path(pair["model"])
    bundle = peer.edgeinfer_target(pair, model, args.ctx)
    gguf = _llamacpp.gguf(model, pair["gguf"])
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    peer.CTX, peer.SLOTS = args.ctx, 2
    work = Path(tempfile.mkdtemp(prefix=f"peer-long-{name}-"))
    servers = peer.start_servers(bundle, gguf, _llamacpp.binaries(), args.threads, work)
    runs: dict[str, dict[int, list]] = {side: {n: [] for n in lengths} for side in servers}
    try:
        for s in servers.values():
            _peer.run_level(s.url, s.model, [prompt(tok, 16, 999)], 4)  # warm-up
        for r in range(args.rounds):
            for n in lengths:
                text = prompt(tok, n, 100 * r + n % 97)
                for side, s in servers.items():
                    row = _peer.run_level(s.url, s.model, [text], NEW_TOKENS)
                    runs[side][n].append({"ttft_ms": row["ttft_ms_p50"], "prompt_tokens": row["prompt_tokens"]})
    finally:
        for s in servers.values():
            s.close()
    out = {"bundle": str(bundle), "gguf": str(gguf), "runs": runs, "lengths": {}}
    for n in lengths:
        med = {side: statistics.median(x["ttft_ms"] for x in runs[side][n]) for side in servers}
        out["lengths"][n] = {"ttft_ms_p50": med, "ratio": round(med["edgeinfer"] / med["llamacpp"], 3),
                             "prompt_tokens": sorted({t for side in servers for x in runs[side][n]
                                                      for t in x["prompt_tokens"]})}
        print(f"{name} prompt {n}: TTFT edgeinfer {med['edgeinfer']:.0f} ms, llama.cpp {med['llamacpp']:.0f} ms "
              f"(ratio {out['lengths'][n]['ratio']})")
    return out


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--pairs", default="smol-host-w8a16,smol-host-fp16")
    ap.add_argument("--prompts", default="512,1500", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="peer_long_prompt")
    args = ap.parse_args()
    lengths = [int(x) for x in args.prompts.split(",")]
    if max(lengths) + NEW_TOKENS > args.ctx:
        ap.error(f"--ctx {args.ctx} must hold the longest prompt and {NEW_TOKENS} new tokens")
    pairs = {name: measure(name, lengths, args) for name in args.pairs.split(",")}
    write(args.out, {"settings": {"ctx": args.ctx, "rounds": args.rounds, "threads": args.threads,
                                  "new_tokens": NEW_TOKENS, "prompts": lengths}, "pairs": pairs})


if __name__ == "__main__":
    main()
