"""The host's int4 in blocks of 128 (``w4a16_g128`` / ``w4a8_g128``) against its default blocks of 32: weights
file bytes against the plan's weights, decode tokens/s against the plan's estimate, on this machine.

Models: bench/planner_host_llm.py's random Qwen3s (~53 M and ~210 M parameters; random weights: speed and bytes
only, deploy's golden check is a trained model's question, docs/generation.md). Each scheme is converted as
``deploy --board host --quant`` builds it (bench/_common.py ``onnxruntime_decoder``) and measured in a fresh
process as planner_host_llm.py measures a row (one thread, 64 tokens after a 128-token prompt, best of 5 runs),
the schemes of a model in turn, ``--rounds`` times (A B A B: a round's order is the same, the machine's drift
spreads over all). Writes bench/results/int4_groups.json (``--out NAME``: bench/results/NAME.json).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, write  # noqa: E402
from planner_host_llm import MODELS, NEW_TOKENS, PROMPT, export, measure, model_path  # noqa: E402

SCHEMES = ("w4a16", "w4a16_g128", "w4a8", "w4a8_g128")


def weights_bytes(built: Path) -> int:
    return sum(p.stat().st_size for p in built.rglob("*.onnx.data"))


def planned(model: Path, scheme: str) -> dict:
    """``plan --board host`` at the rows' decode context: its weights and its decode estimate."""
    from edgeinfer.planning.planner import plan

    p = plan(str(model), "host", quant=scheme, ctx=PROMPT + NEW_TOKENS, suggest=False)
    return {"weights_bytes": p.breakdown["weights"], "decode_tokens_per_s": p.estimates.decode_tokens_per_s}


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default="random-qwen3-53m,random-qwen3-210m")
    ap.add_argument("--out", default="int4_groups")
    args = ap.parse_args()
    wanted = args.models.split(",")
    results = []
    for name, shape in [m for m in MODELS if m[0] in wanted]:
        model = model_path(shape)
        built = {s: export(name, model, s) for s in SCHEMES}
        runs: dict[str, list[float]] = {s: [] for s in SCHEMES}
        for r in range(args.rounds):
            for s in SCHEMES:
                runs[s].append(max(measure(built[s], model)["decode_tokens_per_s_runs"]))
                print(f"{name} round {r + 1} {s}: {runs[s][-1]:.2f} tok/s", file=sys.stderr)
        for s in SCHEMES:
            plan_ = planned(model, s)
            results.append({"model": name, "scheme": s, "weights_file_bytes": weights_bytes(built[s]),
                            "planned_weights_bytes": plan_["weights_bytes"],
                            "decode_tokens_per_s": statistics.median(runs[s]), "rounds": runs[s],
                            "planned_decode_tokens_per_s": plan_["decode_tokens_per_s"]})
    write(args.out, {"schemes": SCHEMES, "rounds": args.rounds, "results": results})


if __name__ == "__main__":
    main()
