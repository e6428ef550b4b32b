"""Property tests: random valid configurations never crash; memory is monotone in ctx and batch."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer.errors import EdgeInferError
from edgeinfer.planning.boards import load_boards
from edgeinfer.planning.models import catalog_names, resolve
from edgeinfer.planning.planner import plan

MODELS = catalog_names()
BOARDS = sorted(load_boards(plugins=False)) + ["host"]
SCHEMES = ["fp32", "fp16", "bf16", "w8a8", "w8a16", "w4a16", "w4a16_g128", "w8a8_g128", "Q4_K_M", "Q8_0", None]
KV = [None, "fp16", "fp32", "q8_0", "q4_0", "int8"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(BOARDS), st.sampled_from(SCHEMES),
       st.integers(1, 200_000), st.integers(1, 256), st.sampled_from(KV))
def test_random_configs_never_crash(model, board, quant, ctx, batch, kv):
    try:
        p = plan(model, board, quant=quant, ctx=ctx, batch=batch, kv_dtype=kv, suggest=False)
    except EdgeInferError as e:  # the refusals a valid configuration may meet: a scheme the board lacks, or an
        msg = e.one_line()  # architecture the board's backend does not export (planned on the runtime it deploys for)
        assert e.exit_code == 2 and "\n" not in msg
        exported = re.fullmatch(rf"board {board}: backend '\w+' exports [\w, .-]+ decoders, not '([\w.-]+)'; .*", msg)
        # a context the model cannot run: refused, as deploy refuses it
        over = re.fullmatch(r"--ctx (\d+) exceeds the model's max_position_embeddings \((\d+)\); use --ctx \2 or "
                            "less", msg)
        if over:
            assert int(over[1]) == ctx > int(over[2]) == resolve(model).max_position, msg
            return
        # a KV dtype the runtime does not build (runtimes.yaml kv_dtypes): refused, as deploy refuses it
        kv_refused = re.fullmatch(r"runtime \S+ keeps its KV cache in ([\w, ]+), not '(\w+)' \(use --kv-dtype .*\)",
                                  msg)
        if kv_refused:
            assert kv_refused[2] == kv and kv.replace("f16", "fp16") not in kv_refused[1].split(", "), msg
            return
        assert (f"board {board} does not support" in msg and "(supported" in msg) or exported, msg
        if exported:
            assert exported[1] == resolve(model).architecture, msg
        return
    d = p.to_dict()
    assert sum(d["memory"]["breakdown"].values()) == d["memory"]["total_bytes"]
    assert all(v >= 0 for v in d["memory"]["breakdown"].values())
    assert d["fits"] == (not d["reasons"])
    dec = d["estimates"]["decode_tokens_per_s"]
    assert dec is None or dec > 0


@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(BOARDS), st.integers(1, 50_000), st.integers(1, 50_000),
       st.integers(1, 64), st.integers(1, 64))
def test_memory_monotone_in_ctx_and_batch(model, board, c1, c2, b1, b2):
    limit = resolve(model).max_position or c1 + c2  # a longer context is refused (test_random_configs_never_crash)
    c1, c2 = sorted((min(c1, limit), min(c2, limit)))
    b1, b2 = sorted((b1, b2))
    try:
        lo = plan(model, board, ctx=c1, batch=b1, suggest=False)
    except EdgeInferError:
        return
    hi_ctx = plan(model, board, ctx=c2, batch=b1, suggest=False)
    hi_batch = plan(model, board, ctx=c1, batch=b2, suggest=False)
    for k in ("kv_cache", "activations"):
        assert hi_ctx.breakdown[k] >= lo.breakdown[k]
        assert hi_batch.breakdown[k] >= lo.breakdown[k]
    # without the reserve: the host's is what other processes use (MemTotal - MemAvailable), read at each plan
    lo_total, ctx_total, batch_total = (p.total_bytes - p.breakdown["reserved"] for p in (lo, hi_ctx, hi_batch))
    assert ctx_total >= lo_total and batch_total >= lo_total
