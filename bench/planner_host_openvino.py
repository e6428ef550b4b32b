"""Planner vs this machine for the OpenVINO CPU runtime (``openvino-cpu``, the ``openvino`` backend's CPU build):
measured decode tokens/s and what ``plan --board host --runtime openvino-cpu`` predicts, and the rows
bench/fit_speed.py fits the host-cpu openvino-cpu constants on (bench/data/rows_host_openvino.yaml, row ids
3200-3299, replaced by each run).

The method of bench/planner_host_llm.py (its models, prompt, context and bandwidth rule), on OpenVINO: the plugin's
conversion for ``openvino-cpu`` (what ``deploy --board host --runtime openvino-cpu`` builds; cached), each measurement
in a fresh subprocess (``load_decoder(ir, threads=1)``: GenAI's LLMPipeline on the CPU, one inference thread), greedy,
EOS ignored, one warm-up then ``REPEAT`` runs, decode tok/s = the fastest. Memory is planned at the positions the
run writes (``mem_ctx`` = prompt + new tokens): GenAI allocates the KV cache as they are written. Predicted three
ways, as there: ``plan_host`` (the shipped constants), ``fit_all`` (the host board calibrated on these rows,
in-sample) and ``left_out`` (calibrated without the row's model).

    python bench/planner_host_openvino.py [--report]      # --report: the committed rows, no measuring

Writes bench/results/planner_host_openvino.json and bench/data/rows_host_openvino.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import planner_host_llamacpp as sibling  # noqa: E402
import planner_host_llm as base  # noqa: E402
from _common import arguments  # noqa: E402

ROWS = base.ROOT / "bench" / "data" / "rows_host_openvino.yaml"
FIRST_ROW = 3200
RUNTIME = "openvino-cpu"
SCHEMES = ("fp32", "fp16", "w8a16")


def converted(name: str, model: Path, scheme: str) -> Path:
    """The plugin's ``openvino-cpu`` conversion of ``model`` (what ``deploy --runtime openvino-cpu`` builds), now,
    so that no child counts it: cached by the model's name, the scheme and the plugin's code. No golden check: the
    random models' flat logits make greedy agreement meaningless (bench/peer_llamacpp.py)."""
    import shutil

    import edgeinfer
    from edgeinfer.contract import cache

    backend = edgeinfer.backend("openvino")
    out = cache.area("bench") / "planner_host_openvino" / f"{name}-{scheme}-{base.CTX}-{cache.code(backend)}"
    if not (out / "edgeinfer_decoder.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        backend.convert_decoder(model, scheme, base.CTX, out, None, runtime=RUNTIME)
    return out


def measured_row(i: int, name: str, model: Path, scheme: str, source: str, source_id: str) -> dict:
    written = base.PROMPT + base.NEW_TOKENS

    def note(meas: dict, runs: list[float]) -> str:
        return (f"OpenVINO GenAI LLMPipeline on {meas['device']}, {scheme} (KV {meas['kv_dtype']}), 1 inference "
                f"thread, greedy, {base.NEW_TOKENS} new tokens after a {base.PROMPT}-token prompt, "
                f"{sibling.best_of(runs)}; KV capacity {base.CTX} tokens ({meas['kv_cache_bytes']} B), allocated as "
                f"written: {written} tokens")

    # GenAI allocates the KV cache as positions are written (docs/openvino.md): mem_ctx is the run's, not CTX
    return sibling.timed_row(FIRST_ROW + i, RUNTIME, "openvino", converted(name, model, scheme), name, model, scheme,
                             source, source_id, written, note)


if __name__ == "__main__":
    ap = arguments(__doc__)
    ap.add_argument("--report", action="store_true", help="measure nothing: report on the committed rows")
    sibling.print_report(sibling.run("planner_host_openvino", ROWS, measured_row, SCHEMES,
                                     "openvino (GenAI LLMPipeline on the CPU, 1 inference thread)",
                                     measure_rows=not ap.parse_args().report))
