"""Several models planned together as ``edgeinfer serve`` lays them out (edgeinfer/planning/chain.py, chain_plan.py),
and serve's start-up check of the same sum (edgeinfer/serve/budget.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgeinfer.planning.boards import GIB
from edgeinfer.planning.chain import Member, layout
from edgeinfer.planning.chain_plan import Entry, plan_chain
from edgeinfer.planning.planner import plan
from edgeinfer.planning.serve_memory import serve_processes
from edgeinfer.testing.cli import in_process_cli

MIB = 2**20

cli, _bind_capfd = in_process_cli()
MIB = 2**20
EMB, RERANKER, LLM = "all-minilm-l6-v2", "BAAI/bge-reranker-base", "qwen3-4b"


def test_a_chain_fits_one_board_and_not_a_smaller_one():
    # by hand: qwen3-4b in w8a8 is ~4.0e9 parameters x 1 byte = 3.75 GiB of weights, and 4 slots of 8192 positions
    # hold 36 layers x 2 x 8 KV heads x 128 x 2 bytes x 8192 x 4 = 4.5 GiB of KV: more than rk3588-8g's 7 usable
    # GiB; rk3588-16g has 15 usable GiB for them, the activations and two encoders under 1 GiB
    entries = [Entry(EMB), Entry(RERANKER), Entry(LLM, {"quant": "w8a8", "ctx": 8192})]
    small, big = plan_chain(entries, "rk3588-8g"), plan_chain(entries, "rk3588-16g")
    assert not small.fits and big.fits
    assert small.reasons[0].startswith("together they need") and f"the largest is {LLM}" in small.reasons[0]
    s = small.suggestions
    assert s["board"] == "rk3588-16g"  # the smallest of the family that takes the chain, as planned just above
    assert [m["model"] for m in s["models"]] == [LLM, RERANKER, EMB]  # largest first
    shorter = s["models"][0]["max_ctx"]
    assert shorter and shorter < 8192 and s["models"][0]["quant"] is None  # w8a8 is rk3588's smallest decoder scheme
    assert plan_chain(entries[:2] + [Entry(LLM, {"quant": "w8a8", "ctx": shorter})], "rk3588-8g").fits
    assert not plan_chain(entries[:2] + [Entry(LLM, {"quant": "w8a8", "ctx": shorter + 64})], "rk3588-8g").fits


def test_the_breakdown_sums_per_model_and_per_process():
    c = plan_chain([Entry(EMB), Entry(RERANKER), Entry("qwen3-0.6b")], "rk3588-16g")
    d = c.to_dict()
    mem = d["memory"]
    own = sum(p["own_bytes"] for p in d["processes"])
    sp = serve_processes()  # serve's HTTP process, counted once, with the tokenizers of the two encoder models
    parts = sp["parts_mib"]  # and what encoders add: numpy in the HTTP process, the spawned workers' resource tracker
    qwen_tokenizer = 63_252_313  # and the decoder's: (151936 - 3072) tokens × 424.9 bytes (serve_memory.json)
    assert own == int((sp["value"] + parts["with_encoders"] + 2 * parts["tokenizer_each"]) * MIB) + qwen_tokenizer
    assert mem["total_bytes"] == sum(p["total_bytes"] for p in d["processes"]) + mem["reserved_bytes"]
    assert mem["total_bytes"] == sum(m["memory"]["total_bytes"] for m in d["models"]) + own + mem["reserved_bytes"]
    for m in d["models"]:
        parts = m["memory"]
        assert parts["total_bytes"] == sum(parts[k] for k in ("weights", "kv_cache", "activations", "runtime"))
    where = {m["name"]: m["processes"] for m in d["models"]}
    assert where[EMB] == where[RERANKER] == ["encoder worker"]
    assert where["qwen3-0.6b"] == ["decoder worker qwen3-0.6b"]
    assert [m["options"]["batch"] for m in d["models"]] == [32, 32, 4]  # serve's --max-batch and --slots defaults


def test_a_runtime_counts_once_per_process():
    from edgeinfer.testing.serve import measured_served_worker_saving

    mib = 2**20
    a = Member("a", False, "ort", weights=100 * mib, kv_cache=0, activations=10 * mib, runtime_fixed=50 * mib,
               runtime_scaled=0)
    b = Member("b", False, "ort", weights=200 * mib, kv_cache=0, activations=20 * mib, runtime_fixed=50 * mib,
               runtime_scaled=5 * mib)
    llm = Member("llm", True, "ort", weights=300 * mib, kv_cache=30 * mib, activations=3 * mib,
                 runtime_fixed=50 * mib, runtime_scaled=0)
    http, worker, decoder = layout([a, b, llm])
    assert worker.total_bytes == (100 + 10 + 200 + 20 + 5 + 50) * mib  # one fixed overhead for both encoders
    # the decoder's own process pays its own, less what a served worker holds less than the process the runtime
    # overheads were measured in (no manifest schema), never more than bench/serve_processes.py measured
    lighter = (300 + 30 + 3 + 50) * mib - decoder.total_bytes
    assert 0.9 * measured_served_worker_saving() <= lighter <= measured_served_worker_saving(), lighter / mib
    _, w1, w2, _ = layout([a, b, llm], workers=2)
    assert w1.total_bytes == w2.total_bytes == worker.total_bytes  # each --devices entry holds every encoder


def test_an_in_process_decoder_lives_in_the_http_process_one_interpreter_lighter():
    """serve --in-process: no decoder worker; the decoder's bytes count in the HTTP process, less the saving
    bench/serve_processes.py measured (the smaller of its two bundles)."""
    from edgeinfer.testing.serve import measured_in_process_saving

    saved = measured_in_process_saving()
    mib = 2**20
    a = Member("a", False, "ort", weights=100 * mib, kv_cache=0, activations=10 * mib, runtime_fixed=76 * mib,
               runtime_scaled=0)
    llm = Member("llm", True, "ort", weights=300 * mib, kv_cache=30 * mib, activations=3 * mib,
                 runtime_fixed=76 * mib, runtime_scaled=0)
    apart = layout([a, llm])
    together = layout([a, llm], in_process=True)
    assert [p.name for p in apart][1:] == ["encoder worker", "decoder worker llm"]
    assert [p.name for p in together][1:] == ["encoder worker"] and "llm" in together[0].parts
    lighter = sum(p.total_bytes for p in apart) - sum(p.total_bytes for p in together)
    assert 0.9 * saved <= lighter <= saved, (lighter / mib, saved / mib)


def test_two_encoders_on_one_worker_pay_the_runtime_once_as_planned_alone():
    """The host runtime's overhead is a fixed part (once per process) and, where fitted, a share of each model's
    weights (each model pays its own): planned together, the worker is both plans alone less one fixed part."""
    alone = [plan(m, "host", batch=32, suggest=False) for m in (EMB, RERANKER)]
    [fixed] = {round(p.details.runtime.overhead_mib * MIB) for p in alone}
    assert all(p.breakdown["runtime"] >= fixed for p in alone)
    c = plan_chain([Entry(EMB), Entry(RERANKER)], "host")
    worker = next(p for p in c.processes if p.name == "encoder worker")
    each = [p.total_bytes - p.breakdown["reserved"] for p in alone]
    assert worker.total_bytes == pytest.approx(sum(each) - fixed, abs=1)


def _chain_file(tmp_path: Path, text: str) -> str:
    p = tmp_path / "chain.yaml"
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_a_chain_file_gives_each_model_its_options_and_workers(tmp_path):
    f = _chain_file(tmp_path, f"workers: 2\nmodels:\n  - {EMB}\n  - model: {LLM}\n"
                              "    quant: w8a8_g128\n    ctx: 1024\n    batch: 2\n")
    r = cli("plan", f, "--board", "rk3588-16g", "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 0 and d["kind"] == "edgeinfer.plan_chain" and d["fits"] is True
    llm = d["models"][1]["options"]
    assert (llm["quant"], llm["ctx"], llm["batch"]) == ("w8a8_g128", 1024, 2)
    assert d["models"][0]["processes"] == ["encoder worker 1", "encoder worker 2"]
    import jsonschema

    schema = json.loads((Path(__file__).parents[1] / "edgeinfer" / "schemas" / "plan.schema.json").read_text())
    jsonschema.validate(d, schema)
    r = cli("plan", EMB, RERANKER, LLM, "--board", "rk3588-8g", "--ctx", "8192", "--json")
    assert r.returncode == 1
    jsonschema.validate(json.loads(r.stdout), schema)


@pytest.mark.parametrize("text, needle", [
    ("models: [a\n", "not valid YAML at line"),
    ("models: []\n", "needs a 'models' list"),
    (f"models: [{EMB}]\nboard: host\n", "unknown key 'board'"),
    (f"models:\n  - model: {EMB}\n    qaunt: fp16\n", "models[0]: unknown key 'qaunt'"),
    (f"models:\n  - model: {EMB}\n    ctx: 0\n", "models[0]: ctx must be a positive integer"),
    (f"models: [{EMB}, {EMB}]\n", "listed twice"),
    (f"workers: 0\nmodels: [{EMB}]\n", "workers must be a positive integer"),
])
def test_chain_file_mistakes_are_one_line_exit_2(tmp_path, text, needle):
    r = cli("plan", _chain_file(tmp_path, text), "--board", "host")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1 and needle in lines[0], r.stderr


def test_a_chain_file_needs_one_named_board(tmp_path):
    r = cli("plan", _chain_file(tmp_path, f"models: [{EMB}]\n"), "--board", "all")
    assert r.returncode == 2 and "one named board" in r.stderr and r.stdout == ""


def test_plan_in_process_puts_each_decoder_in_the_http_process_one_saving_lighter():
    """``plan A B C --in-process`` plans the chain as ``serve --in-process`` starts it: no decoder worker, the
    decoders' bytes in the HTTP process; two decoders make it lighter by two measured savings."""
    from edgeinfer.testing.serve import measured_in_process_saving

    chain = [EMB, LLM, "qwen3-0.6b", "--board", "rk3588-16g", "--json"]
    apart, together = (json.loads(cli("plan", *chain, *flag).stdout) for flag in ([], ["--in-process"]))
    assert [p["name"] for p in apart["processes"]][1:] == ["encoder worker", f"decoder worker {LLM}",
                                                          "decoder worker qwen3-0.6b"]
    names = [p["name"] for p in together["processes"]]
    assert len(names) == 2 and names[1] == "encoder worker" and "decoders on its threads" in names[0]
    assert set(together["processes"][0]["models"]) == {LLM, "qwen3-0.6b"}
    lighter = apart["memory"]["total_bytes"] - together["memory"]["total_bytes"]
    saved = measured_in_process_saving()
    assert 2 * 0.9 * saved <= lighter <= 2 * saved, (lighter / MIB, saved / MIB)


def test_plan_in_process_needs_a_chain():
    r = cli("plan", LLM, "--board", "rk3588-16g", "--in-process")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1 and "chain" in lines[0], r.stderr


def test_a_single_model_keeps_its_plan():
    r = cli("plan", LLM, "--board", "rk3588-16g", "--json")
    assert json.loads(r.stdout)["kind"] == "edgeinfer.plan" and r.returncode == 0


# --- serve's start-up check ------------------------------------------------------------------------------------


def _tampered(src: Path, out: Path, board: str, weights: int) -> Path:
    """A copy of ``src`` whose recorded plan claims ``weights`` bytes on ``board`` (the manifest is not sealed)."""
    shutil.copytree(src, out)
    m = json.loads((out / "manifest.json").read_text())
    m["board"], m["plan"]["memory"]["breakdown"]["weights"] = board, weights
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def test_serve_refuses_bundles_that_do_not_fit_their_board_together(tiny_qwen3_host_bundle, tmp_path):
    big = _tampered(tiny_qwen3_host_bundle, tmp_path / "tiny", "rk3588-8g", 9 * GIB)  # alone more than the board
    r = cli("serve", str(big), "--port", "0")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 1, r.stderr
    assert len(lines) == 1 and "on rk3588-8g, which has 8.00 GiB; the largest is tiny" in lines[0]
    assert "--in-process" not in r.stderr  # one process would not fit either


def test_serve_suggests_in_process_when_one_interpreter_less_fits(tiny_qwen3_host_bundle, tmp_path):
    """A decoder that misses its board by less than a worker process costs is refused with the way that fits:
    ``--in-process`` (one interpreter less, bench/serve_processes.py's measured saving), which then passes."""
    from edgeinfer.serve.app import open_models
    from edgeinfer.serve.budget import check_budget
    from edgeinfer.serve.config import ServeConfig
    from edgeinfer.testing.serve import measured_in_process_saving

    def chain_of(bundle, in_process=False):
        config = ServeConfig([bundle], in_process=in_process)
        return check_budget(*open_models(config.bundles, config.ctx, config.slots), config)

    probe = chain_of(_tampered(tiny_qwen3_host_bundle, tmp_path / "probe", "rk3588-8g", GIB))
    over = probe.capacity_bytes - probe.total_bytes + measured_in_process_saving() // 2  # past the line by half
    big = _tampered(tiny_qwen3_host_bundle, tmp_path / "tiny", "rk3588-8g", GIB + over)
    r = cli("serve", str(big), "--port", "0")
    assert r.returncode == 1, r.stderr
    assert "add --in-process, which runs each decoder on a thread of the HTTP process and needs" in r.stderr
    assert "MiB less: then it fits; or serve fewer bundles" in r.stderr
    assert chain_of(big, in_process=True).fits


def test_serve_counts_a_decoder_bundle_as_plan_does(tiny_qwen3_host_bundle):
    from edgeinfer.serve.app import open_models
    from edgeinfer.serve.budget import check_budget
    from edgeinfer.serve.config import ServeConfig

    config = ServeConfig([tiny_qwen3_host_bundle], slots=2)
    models, decoders = open_models(config.bundles, config.ctx, config.slots)
    chain = check_budget(models, decoders, config)
    assert chain is not None and chain.fits and chain.board.name == "host"
    (only,) = chain.members
    recorded = json.loads((tiny_qwen3_host_bundle / "manifest.json").read_text())["plan"]
    kv = recorded["memory"]["breakdown"]["kv_cache"]
    assert only.kv_cache == kv * 2 // recorded["options"]["batch"]  # the KV of --slots 2, as recorded per slot


def test_a_decoder_only_chain_counts_the_http_process_alone():
    """No encoder: no numpy in the HTTP process and no spawned worker, so no resource tracker (serve/child.py);
    the decoder's tokenizer is the HTTP process's ((151936 - 3072) tokens × 424.9 bytes, serve_memory.json)."""
    sp, qwen_tokenizer = serve_processes(), 63_252_313
    own = plan_chain([Entry("qwen3-0.6b")], "rk3588-16g").processes[0]
    assert own.name == "serve (HTTP process)" and own.own_bytes == int(sp["value"] * MIB) + qwen_tokenizer
    with_encoder = plan_chain([Entry(EMB), Entry("qwen3-0.6b")], "rk3588-16g").processes[0]
    parts = sp["parts_mib"]
    assert with_encoder.own_bytes == int((sp["value"] + parts["with_encoders"] + parts["tokenizer_each"]) * MIB) \
        + qwen_tokenizer


def test_plan_suggests_in_process_when_it_is_what_fits():
    """A chain that misses its board by less than one interpreter: the suggestion names ``--in-process`` with the
    bytes it saves, and ``plan --in-process`` of the same chain fits, lighter by exactly those bytes. Far over
    the line, no such suggestion."""
    def fits(ctx: int) -> bool:
        return plan_chain([Entry(EMB), Entry("qwen3-0.6b")], "rk3588-4g", suggest=False, ctx=ctx).fits

    lo, hi = 1024, 32768  # the first context that does not fit with a worker process per decoder
    assert fits(lo) and not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    chain = [EMB, "qwen3-0.6b", "--board", "rk3588-4g", "--ctx", str(hi), "--json"]
    apart, together = (json.loads(cli("plan", *chain, *flag).stdout) for flag in ([], ["--in-process"]))
    assert apart["verdict"] == "does not fit" and together["verdict"] == "fits"
    saving = apart["suggestions"]["in_process"]["saving_bytes"]
    assert saving == apart["memory"]["total_bytes"] - together["memory"]["total_bytes"] > 0
    far = json.loads(cli("plan", EMB, "qwen3-0.6b", "--board", "rk3588-4g", "--ctx", "32768", "--json").stdout)
    assert far["verdict"] == "does not fit" and far["suggestions"]["in_process"] is None
    text = " ".join(cli("plan", *chain[:-1]).stdout.split())  # the table is wrapped to the terminal's width
    assert "or this board with --in-process: each decoder on a thread of serve's HTTP process" in text


def test_a_recorded_decoder_plan_at_more_slots_is_the_plan_at_those_slots():
    """serve's start-up check rescales a bundle's recorded plan to its --slots: where one prefill chunk holds every
    sequence's tokens (llama.cpp; the onnxruntime plugin's served decoders), more slots add logits rows only, so
    the rescaled plan is the plan made at that batch; an encoder's activations grow with every row."""
    from edgeinfer.planning.chain import rescaled
    from edgeinfer.planning.planner import plan

    for runtime in ("onnxruntime", "llama.cpp"):
        one, sixteen = (plan("qwen3-0.6b", "host", quant="fp16", ctx=1024, batch=b, runtime=runtime,
                             suggest=False).to_dict() for b in (1, 16))
        parts = ("weights", "kv_cache", "activations", "runtime")  # the OS reserve is what is in use now
        got, want = rescaled(one, 16)["memory"]["breakdown"], sixteen["memory"]["breakdown"]
        assert {k: got[k] for k in parts} == {k: want[k] for k in parts}, runtime
        assert want["activations"] < 2 * one["memory"]["breakdown"]["activations"], runtime  # not 16 times
    enc = plan("all-minilm-l6-v2", "host", batch=8, suggest=False).to_dict()
    assert rescaled(enc, 32)["memory"]["breakdown"]["activations"] == 4 * enc["memory"]["breakdown"]["activations"]
