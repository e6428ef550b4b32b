import shutil
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.testing import DecoderConformance


class TestOnnxRuntimeDecoders(DecoderConformance):
    backend_name = "onnxruntime"


PROMPTS = {0: [5, 6, 7, 8, 9, 10, 11], 1: [20, 21, 22], 3: [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]}


@pytest.fixture(scope="module")
def multi_slot():
    import edgeinfer
    from edgeinfer.contract import registry as plugins
    from edgeinfer.testing.llm import model_dir

    plugins.reset()
    d = edgeinfer.backend("onnxruntime").load_decoder(model_dir(), device="CPU", context=32, slots=4, threads=1)
    yield d
    d.release()


def solo_steps(d, prompt: list[int], follow: int) -> list[np.ndarray]:
    """Logits of decoding the prompt's last token, then ``follow``, in slot 0 alone (a batch of one)."""
    d.reset(0)
    d.prefill(0, np.array(prompt[:-1]))
    steps = [d.decode([0], np.array(prompt[-1:]))[0], d.decode([0], np.array([follow]))[0]]
    d.reset(0)
    return steps


def test_batched_decode_equals_each_slot_alone_across_an_idle_slot(multi_slot):
    """Slots 0, 1 and 3 at lengths 6, 2 and 10 decode two steps in one run each (out of order), while slot 2
    sits mid-prefill inside the range: every row equals its slot decoded alone, and slot 2's prefill goes on
    as if nothing had run beside it."""
    d = multi_slot
    alone = {s: solo_steps(d, p, 100 + s) for s, p in PROMPTS.items()}
    mid = list(range(50, 62))
    d.reset(0)
    want_mid = d.prefill(0, np.array(mid))
    d.reset(0)
    for s, p in PROMPTS.items():
        d.reset(s)
        d.prefill(s, np.array(p[:-1]))
    d.reset(2)
    d.prefill(2, np.array(mid[:5]))
    order = [3, 0, 1]
    first = d.decode(order, np.array([PROMPTS[s][-1] for s in order]))
    second = d.decode(order, np.array([100 + s for s in order]))
    for i, s in enumerate(order):
        np.testing.assert_allclose(first[i], alone[s][0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(second[i], alone[s][1], rtol=1e-4, atol=1e-4)
    assert d.lengths == [8, 4, 5, 12]
    np.testing.assert_allclose(d.prefill(2, np.array(mid[5:])), want_mid, rtol=1e-4, atol=1e-4)
    for s in range(4):
        d.reset(s)


def test_a_full_idle_slot_in_the_range_is_left_untouched(multi_slot):
    """A full slot between two decoding ones has no free row for a dummy token: the decode still equals
    each slot alone and the full slot's cache is unchanged."""
    d = multi_slot
    alone = {s: solo_steps(d, PROMPTS[s], 100 + s) for s in (1, 3)}
    for s in (1, 3):
        d.reset(s)
        d.prefill(s, np.array(PROMPTS[s][:-1]))
    d.reset(2)
    d.prefill(2, np.arange(200, 200 + d.context))
    before = [kv[0][2].copy() for kv in d._cache]
    got = d.decode([1, 3], np.array([PROMPTS[1][-1], PROMPTS[3][-1]]))
    np.testing.assert_allclose(got[0], alone[1][0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], alone[3][0], rtol=1e-4, atol=1e-4)
    assert all(np.array_equal(b, kv[0][2]) for b, kv in zip(before, d._cache))
    for s in range(4):
        d.reset(s)


def test_prefill_batch_of_prompts_of_different_lengths_equals_each_slot_alone(multi_slot):
    """Slots 0, 1 and 3 take prompts of 7, 3 and 11 tokens in one call while slot 2 holds 2 tokens: 0 and 1
    run together, 3 alone (past slot 2); each row's logits, and the next decode step of each slot, equal the
    slot prefilled alone, and slot 2's 2 positions are untouched. Then a second chunk on top of the first."""
    from edgeinfer_onnxruntime.decoder import prefill_runs

    d = multi_slot
    alone = {}
    for s, p in PROMPTS.items():
        d.reset(0)
        alone[s] = (d.prefill(0, np.array(p)), d.decode([0], np.array([100 + s]))[0])
    for s in range(4):
        d.reset(s)
    d.prefill(2, np.array([60, 61]))
    before = [kv[0][2, :, :2].copy() for kv in d._cache]
    order = [3, 1, 0]
    assert prefill_runs(order, [len(PROMPTS[s]) for s in order], d.lengths, 32) == [[2, 1], [0]]
    got = d.prefill_batch(order, [np.array(PROMPTS[s]) for s in order])
    assert d.lengths == [7, 3, 2, 11]
    after = d.decode(order, np.array([100 + s for s in order]))
    for i, s in enumerate(order):
        np.testing.assert_allclose(got[i], alone[s][0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(after[i], alone[s][1], rtol=1e-4, atol=1e-4)
    assert all(np.array_equal(b, kv[0][2, :, :2]) for b, kv in zip(before, d._cache))  # its 2 positions
    more = d.prefill_batch([0, 1], [np.array([70, 71]), np.array([72])])  # slots with a past: one run each
    for row, ids in zip(more, ([*PROMPTS[0], 100, 70, 71], [*PROMPTS[1], 101, 72])):
        d.reset(2)
        np.testing.assert_allclose(row, d.prefill(2, np.array(ids)), rtol=1e-4, atol=1e-4)
    for s in range(4):
        d.reset(s)


def test_prefill_runs_split_on_gaps_padding_room_and_a_past():
    from edgeinfer_onnxruntime.decoder import prefill_runs

    assert prefill_runs([0, 1, 2], [30, 32, 28], [0, 0, 0], 256) == [[0, 1, 2]]
    assert prefill_runs([0, 2], [30, 30], [0, 0, 0], 256) == [[0], [1]]  # slot 1 is not prefilling
    assert prefill_runs([0, 1], [120, 1], [0, 0], 256) == [[0], [1]]  # 119 padding tokens for 121 real ones
    assert prefill_runs([0, 1], [8, 2], [0, 4], 256) == [[0], [1]]  # slot 1 holds a chunk already


def test_continuous_batching_on_onnxruntime_gives_each_sequence_its_solo_text():
    """The serve scheduler over onnxruntime's batched decode: three sequences joining at different steps (one
    mid-prefill while the others decode) each get the text the generator gives it alone."""
    import edgeinfer
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.serve.decoder_scheduler import Scheduler
    from edgeinfer.testing.llm import model_dir

    prompts = ["The history of the city", "Once upon a time there was a river that", "In the morning"]
    options = GenerationOptions(max_new_tokens=12, ignore_eos=True, temperature=0.0)
    with edgeinfer.load(model_dir(), backend="onnxruntime", ctx=64, threads=1, slots=3) as g:
        alone = [g.generate(p, options).text for p in prompts]
        batches: list[int] = []
        decode = g.decoder.decode
        g.decoder.decode = lambda slots, ids: batches.append(len(slots)) or decode(slots, ids)
        sched = Scheduler(g, prefill_chunk=4)
        texts = dict.fromkeys(range(3), "")
        for rid, p in enumerate(prompts):
            sched.add(rid, g.codec.encode(p), options)
            for _ in range(3):
                for e in sched.step():
                    texts[e.rid] += e.text
        while sched.busy:
            for e in sched.step():
                texts[e.rid] += e.text
    assert [texts[i] for i in range(3)] == alone
    assert {1, 2, 3} <= set(batches)  # the batch grew as the sequences joined


def test_prompts_of_different_lengths_admitted_together_prefill_in_one_call_and_give_their_solo_text():
    """Four prompts (5 to 15 tokens) admitted at once: the first step prefills the first three in one
    ``prefill_batch`` call, the fourth does not fit the budget of 24 tokens beside them and waits whole for
    the next step; every sequence's greedy text equals the generator's alone."""
    import edgeinfer
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.serve.decoder_scheduler import Scheduler
    from edgeinfer.testing.llm import model_dir

    prompts = ["In the morning", "Rivers flow into the sea", "Rivers flow",
               "The history of the old city by the river"]
    options = GenerationOptions(max_new_tokens=10, ignore_eos=True, temperature=0.0)
    with edgeinfer.load(model_dir(), backend="onnxruntime", ctx=64, threads=1, slots=4) as g:
        alone = [g.generate(p, options).text for p in prompts]
        ids = [g.codec.encode(p) for p in prompts]
        assert len({len(i) for i in ids}) == 4 and sum(map(len, ids[:3])) < 24 < sum(map(len, ids))
        calls: list[list[int]] = []
        batch = g.decoder.prefill_batch
        g.decoder.prefill_batch = lambda slots, chunks: calls.append([len(c) for c in chunks]) or batch(slots, chunks)
        sched = Scheduler(g, prefill_chunk=24)
        for rid, i in enumerate(ids):
            sched.add(rid, i, options)
        texts = dict.fromkeys(range(4), "")
        while sched.busy:
            for e in sched.step():
                texts[e.rid] += e.text
    assert calls == [[len(i) for i in ids[:3]], [len(ids[3])]]
    assert [texts[i] for i in range(4)] == alone


def test_a_model_whose_mlp_width_equals_its_vocabulary_is_refused_before_the_builder_runs(tmp_path, capfd):
    # onnxruntime-genai's builder would take the MLP's up/gate projection for the LM head (wrong logits)
    from edgeinfer.testing import llm
    from edgeinfer.testing.cli import run_cli

    model = llm.random_qwen3(tmp_path / "clash", layers=1, hidden=64, heads=2, kv_heads=1,
                             intermediate=llm.VOCAB_SIZE, max_positions=256)
    r = run_cli(capfd, "deploy", str(model), "--board", "host", "-o", str(tmp_path / "bundle"), "--ctx", "64")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()  # the plan deploy announced before converting, then the refusal
    assert len(lines) == 2 and lines[0].startswith("plan: clash on host: onnxruntime fp32, ctx 64, fits"), r.stderr
    assert "intermediate_size equals vocab_size" in lines[1] and "Traceback" not in r.stderr
    assert not (tmp_path / "bundle").exists()


def test_onnxruntime_refuses_external_data_outside_the_graphs_directory(tmp_path):
    """The decoder checks the graph file genai_config.json names (contract.helpers.inside); the graph's own
    external-data locations are left to onnxruntime, which refuses one that leads out of its directory."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "m").mkdir()
    onnx.save(model, str(tmp_path / "m" / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="../outside.data", size_threshold=0)
    assert (tmp_path / "outside.data").is_file()
    with pytest.raises(Exception, match="escapes model directory"):
        ort.InferenceSession(str(tmp_path / "m" / "model.onnx"), providers=["CPUExecutionProvider"])


def without_last_index(built: Path, out: Path) -> Path:
    """A copy of the converted ``built`` directory whose graph is the builder's own again: the LM head over every
    position, no ``last_index`` input (what decoders converted before it was added hold)."""
    import onnx
    from edgeinfer_onnxruntime.last_logits import INPUT

    shutil.copytree(built, out)
    graph = out / "model.onnx"
    model = onnx.load(str(graph), load_external_data=False)
    gather = next(n for n in model.graph.node if n.op_type == "GatherND" and INPUT in n.input)
    for n in model.graph.node:
        n.input[:] = [gather.input[0] if i == gather.output[0] else i for i in n.input]
    model.graph.node.remove(gather)
    model.graph.input.remove(next(i for i in model.graph.input if i.name == INPUT))
    logits = next(o for o in model.graph.output if o.name == "logits").type.tensor_type.shape.dim[1]
    logits.Clear()
    logits.dim_param = "sequence_length"
    onnx.save_model(model, str(graph))
    return out


def test_the_lm_head_runs_at_one_position_per_row_and_older_graphs_still_load(multi_slot, tmp_path):
    """The converted graph gives one row of logits per sequence, at the position ``last_index`` names, whatever
    the run's length (the builder's gives ``[batch, n, vocab]``); its prefills and batched prefills of prompts of
    different lengths equal those of the builder's own graph, which still loads and runs."""
    import onnxruntime as ort
    from edgeinfer_onnxruntime.decoder import OnnxRuntimeDecoder

    d = multi_slot
    built = Path(d._onnx).parent
    sess = ort.InferenceSession(d._onnx, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([1, i.shape[1], 0, i.shape[3]], np.float32) for i in sess.get_inputs()
             if i.name.startswith("past_key_values")}
    ids = np.array([PROMPTS[3]], np.int64)
    feeds.update(input_ids=ids, attention_mask=np.ones_like(ids), last_index=np.array([[[4]]], np.int64))
    if sess.get_inputs()[2].type == "tensor(float16)":
        feeds = {k: v.astype(np.float16) if k.startswith("past") else v for k, v in feeds.items()}
    (logits, *_) = sess.run(["logits"], feeds)
    assert logits.shape == (1, 1, d.vocab_size)

    old = OnnxRuntimeDecoder(without_last_index(built, tmp_path / "builder-graph"), 32, 4, threads=1)
    try:
        assert old._last is False and d._last is True
        for s in range(4):
            d.reset(s)
            old.reset(s)
        np.testing.assert_allclose(d.prefill(0, ids[0, :5]), logits[0, 0], rtol=1e-4, atol=1e-4)
        d.reset(0)
        order = [3, 1, 0]
        prompts = [np.array(PROMPTS[s]) for s in order]
        np.testing.assert_allclose(d.prefill_batch(order, prompts), old.prefill_batch(order, prompts),
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(d.decode(order, np.array([100, 101, 102])),
                                   old.decode(order, np.array([100, 101, 102])), rtol=1e-4, atol=1e-4)
    finally:
        old.release()
        for s in range(4):
            d.reset(s)


def test_spin_wait_reaches_the_session_and_a_wrong_value_is_refused(multi_slot):
    """``spin_wait`` (serve passes False for several decoders on one CPU: ServeConfig.spin_wait) sets onnxruntime's
    ``session.intra_op.allow_spinning``; without it the session keeps onnxruntime's default (no entry)."""
    import edgeinfer
    from edgeinfer.errors import InputError
    from edgeinfer.testing.llm import model_dir

    key = "session.intra_op.allow_spinning"
    with pytest.raises(RuntimeError, match="does not have configuration"):
        multi_slot._sess.get_session_options().get_session_config_entry(key)
    backend = edgeinfer.backend("onnxruntime")
    for value, entry in ((False, "0"), (True, "1")):
        d = backend.load_decoder(model_dir(), device="CPU", context=32, slots=1, threads=1, spin_wait=value)
        try:
            assert d._sess.get_session_options().get_session_config_entry(key) == entry
            assert d._sess.get_session_options().intra_op_num_threads == d.threads == 1  # bench reports it
        finally:
            d.release()
    with pytest.raises(InputError, match="spin_wait must be true or false"):
        backend.load_decoder(model_dir(), device="CPU", context=32, slots=1, spin_wait="no")


def test_a_build_from_another_plugin_code_is_not_reused(tmp_path, monkeypatch):
    """``load_decoder`` of a Hugging Face directory builds into the cache once; an edited plugin (another
    ``cache.code``) builds again instead of reusing what older code built."""
    from edgeinfer_onnxruntime import decoder as ort_decoder

    from edgeinfer.contract import cache

    built = []

    def fake_build(hf_dir, out, precision, kv_dtype):
        built.append(out)
        out.mkdir(parents=True)
        (out / ort_decoder.GENAI_CONFIG).write_text("{}")
        return out

    monkeypatch.setattr(ort_decoder, "_build", fake_build)
    monkeypatch.setattr(ort_decoder, "builder_version", lambda: "0.14.1")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    first = ort_decoder.build(hf, tmp_path / "cache", "fp32")
    assert ort_decoder.build(hf, tmp_path / "cache", "fp32") == first and len(built) == 1
    monkeypatch.setattr(cache, "code", lambda obj: "edited")
    again = ort_decoder.build(hf, tmp_path / "cache", "fp32")
    assert again != first and built == [first, again]
