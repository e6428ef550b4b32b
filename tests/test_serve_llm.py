"""``edgeinfer serve`` on a decoder (the committed tiny-qwen3 on the transformers reference), through the
official ``openai`` client on loopback: streamed and whole answers equal ``edgeinfer generate``, concurrent
streams each equal their solo run, admission (429, 400), disconnects, a killed worker and SIGTERM."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import re
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.serve import ServerProc, runtime_libraries

openai = pytest.importorskip("openai")

CTX = 256
SLOTS = 4
QUEUE = 2
PROMPTS = ["The history of the city", "Once upon a time", "Rivers flow into", "In the morning the children",
           "A small village near", "The old man said"]


@pytest.fixture(scope="module")
def generator():
    import edgeinfer

    with edgeinfer.load(model_dir(), ctx=CTX, threads=1, slots=3) as g:
        yield g


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-llm") / "log"
    with ServerProc([model_dir()], "--slots", str(SLOTS), "--max-queue", str(QUEUE), "--ctx", str(CTX),
                    "--threads", "1", log=log) as s:
        yield s


def children(pid: int) -> list[int]:
    from pathlib import Path

    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def maps(pid: int, library: str) -> bool:
    from pathlib import Path

    return library in Path(f"/proc/{pid}/maps").read_text()


def numpy_mapped(pid: int) -> bool:
    return maps(pid, "_multiarray_umath")


def test_the_http_process_maps_no_runtime_library_only_its_worker_does(tiny_qwen3_host_bundle, tmp_path):
    """Issue 30 (footprint): the HTTP process of a served decoder bundle loads neither torch nor a model runtime
    (onnxruntime here) nor numpy (~15 MiB of RSS); its decoder worker does, which shows the check sees them where
    they are. The worker is its only child (serve.child: no resource tracker), after a chat request too."""
    with ServerProc([tiny_qwen3_host_bundle], "--threads", "1", log=tmp_path / "log") as s:
        assert runtime_libraries(s.proc.pid) == []
        assert not numpy_mapped(s.proc.pid)
        workers = [runtime_libraries(c) for c in children(s.proc.pid)]
        assert any("onnxruntime" in p for libs in workers for p in libs), (workers, s.output())
        assert any(numpy_mapped(c) for c in children(s.proc.pid))
        # the tokenizer (a Qwen vocabulary's costs ~40 MiB resident) is the HTTP process's alone: the worker
        # sends token ids (bench/results/serve_processes-llamacpp-qwen-vocab-{base,facts}.json)
        # and the worker loads the bundle from what the HTTP process read of its manifest, without the manifest's
        # schema: no pydantic (~9 MiB of RSS with edgeinfer's models of it, bench/README.md)
        for library in ("tokenizers.abi3", "_pydantic_core"):
            assert maps(s.proc.pid, library) and not any(maps(c, library) for c in children(s.proc.pid)), library
        assert len(children(s.proc.pid)) == 1, s.output()  # the worker: no multiprocessing resource tracker
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "The licence", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and not numpy_mapped(s.proc.pid), r.text  # nor after a request
        # a chat request's template renders on a thread of the HTTP process: no request helper (~48 MiB and the
        # tokenizers) nor resource tracker (~13 MiB) starts for it (bench/results/serve_processes-*-chat-*.json)
        r = httpx.post(s.url + "/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "The licence"}], "max_tokens": 2})
        assert r.status_code == 200 and len(children(s.proc.pid)) == 1, (r.text, s.output())


def test_the_http_process_of_a_model_directory_maps_no_runtime_library(server):
    assert runtime_libraries(server.proc.pid) == []


def client(server: ServerProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def solo(generator, prompt: str, chat: bool, max_tokens: int, **kw) -> str:
    from edgeinfer.contract.generation import GenerationOptions

    return generator.generate(prompt, GenerationOptions(max_new_tokens=max_tokens, **kw), chat=chat).text


def stream_text(c: openai.OpenAI, prompt: str, chat: bool, max_tokens: int, **kw) -> str:
    if chat:
        chunks = c.chat.completions.create(model="tiny-qwen3", messages=[{"role": "user", "content": prompt}],
                                           max_tokens=max_tokens, stream=True, **kw)
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    chunks = c.completions.create(model="tiny-qwen3", prompt=prompt, max_tokens=max_tokens, stream=True, **kw)
    return "".join(ch.choices[0].text for ch in chunks if ch.choices)


def metric(server: ServerProc, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    m = re.search(rf'^{name}\{{model="tiny-qwen3"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def wait_for(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def decoder_state(server: ServerProc) -> dict:
    return httpx.get(server.url + "/ready").json()["decoders"][0]


# --- the decoder's batched decode -------------------------------------------------------------------


def test_batched_decode_equals_each_slot_alone(generator):
    """Three sequences of different lengths decoded in one batched step give each slot's solo logits."""
    d = generator.decoder
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
    alone = []
    for p in prompts:
        d.reset(0)
        d.prefill(0, np.array(p[:-1]))
        alone.append(d.prefill(0, np.array(p[-1:])))  # the single-sequence StaticCache path
    for s, p in enumerate(prompts):
        d.reset(s)
        d.prefill(s, np.array(p[:-1]))
    batched = d.decode([2, 0, 1], np.array([prompts[2][-1], prompts[0][-1], prompts[1][-1]]))
    for row, s in zip(batched, [2, 0, 1]):
        np.testing.assert_allclose(row, alone[s], rtol=1e-4, atol=1e-4)
    for s in range(3):
        d.reset(s)


def test_long_prompt_prefills_in_chunks_while_a_stream_keeps_decoding(generator):
    """A 120-token prompt joins a running sequence: it is read 8 tokens per step, the running sequence
    gets a token at every one of those steps, and both texts equal their solo runs."""
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.serve.decoder_scheduler import Scheduler

    sched = Scheduler(generator, prefill_chunk=8)
    sched.add("a", generator.codec.encode(PROMPTS[0]), GenerationOptions(max_new_tokens=30, ignore_eos=True))
    texts = {"a": "", "b": ""}
    while not sched.decoding:
        texts["a"] += "".join(e.text for e in sched.step())
    long_prompt = generator.codec.decode(generator.codec.encode(" ".join(PROMPTS * 4))[:120])
    long_ids = generator.codec.encode(long_prompt)
    sched.add("b", long_ids, GenerationOptions(max_new_tokens=5, ignore_eos=True))
    steps: list[set[str]] = []
    while sched.busy:
        events = sched.step()
        steps.append({e.rid for e in events if e.tokens})
        for e in events:
            texts[e.rid] += e.text
    first_b = next(i for i, s in enumerate(steps) if "b" in s)
    assert first_b == -(-len(long_ids) // 8) - 1
    assert all("a" in s for s in steps[: first_b + 1])
    assert texts["a"] == solo(generator, PROMPTS[0], False, 30, ignore_eos=True)
    assert texts["b"] == solo(generator, long_prompt, False, 5, ignore_eos=True)
    assert sched.free == [0, 1, 2] and sched.running == 0


# --- the API -----------------------------------------------------------------------------------------


def test_models_lists_the_decoder_and_unknown_model_is_openai_404(server):
    c = client(server)
    ids = [m.id for m in c.models.list().data]
    assert ids == ["tiny-qwen3"]
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["message"].startswith("The model 'nope' does not exist")


def test_a_decoder_only_server_reports_no_embedding_worker_and_names_its_endpoints(server):
    text = httpx.get(server.url + "/metrics").text
    assert "edgeinfer_worker_up{" not in text and "edgeinfer_kv_slots_total" in text
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "tiny-qwen3", "input": "hi"}, timeout=60)
    assert r.status_code == 400, r.text
    assert "served on /v1/chat/completions and /v1/completions, not on /v1/embeddings" in r.json()["error"]["message"]


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): no interpreter start-up per call."""
    return functools.partial(run_cli, capfd)


def test_streamed_chat_equals_edgeinfer_generate(server, cli):
    prompt = "Tell me about rivers"
    out = cli("generate", str(model_dir()), "--prompt", prompt, "--chat", "--max-new-tokens", "24", "--ctx", str(CTX),
              "--json")
    assert out.returncode == 0, out.stderr
    expected = json.loads(out.stdout)["text"]
    c = client(server)
    assert expected
    assert stream_text(c, prompt, True, 24, temperature=0) == expected
    whole = c.chat.completions.create(model="tiny-qwen3", messages=[{"role": "user", "content": prompt}],
                                      max_tokens=24, temperature=0)
    assert whole.choices[0].message.content == expected
    assert whole.usage.completion_tokens == len(json.loads(out.stdout)["token_ids"])
    assert whole.usage.prompt_tokens == json.loads(out.stdout)["prompt_tokens"]


def test_completions_seeded_sampling_and_stop_equal_the_generator(server, generator):
    c = client(server)
    kw = {"temperature": 0.9, "top_p": 0.9, "seed": 11}
    expected = solo(generator, PROMPTS[1], False, 20, **kw)
    assert stream_text(c, PROMPTS[1], False, 20, **kw) == expected
    whole = c.completions.create(model="tiny-qwen3", prompt=PROMPTS[1], max_tokens=20, **kw)
    assert whole.choices[0].text == expected
    greedy = solo(generator, PROMPTS[0], False, 20, temperature=0.0)
    stop = greedy.split()[2]  # a word the greedy continuation reaches
    cut = c.completions.create(model="tiny-qwen3", prompt=PROMPTS[0], max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].text == greedy[: greedy.index(stop)] and cut.choices[0].finish_reason == "stop"
    # the stop string is seen by the HTTP process (the worker has no text): the tokens counted are the
    # generator's up to it, and the worker is told to stop the sequence, which frees its slot
    from edgeinfer.contract.generation import GenerationOptions

    alone = generator.generate(PROMPTS[0], GenerationOptions(max_new_tokens=20, stop=(stop,)), chat=False)
    assert cut.usage.completion_tokens == len(alone.token_ids) < 20
    wait_for(lambda: decoder_state(server)["running"] == 0)


def test_concurrent_streams_each_equal_their_solo_run(server, generator):
    """Six streams at once on four slots: sequences join and leave the running batch, each gets its own text."""
    expected = [solo(generator, p, i % 2 == 0, 32, temperature=0.0) for i, p in enumerate(PROMPTS)]
    c = client(server)
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        got = list(ex.map(lambda ip: stream_text(c, ip[1], ip[0] % 2 == 0, 32, temperature=0), enumerate(PROMPTS)))
    assert got == expected


def test_n_above_1_and_prompt_past_the_context_are_400(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError, match="n=2"):
        c.completions.create(model="tiny-qwen3", prompt="hi", n=2, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
        c.completions.create(model="tiny-qwen3", prompt="hi", max_tokens=CTX)


# --- request validation and logprobs ----------------------------------------------------------------


@pytest.mark.parametrize("path, body, words", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "4"}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "hi", "seed": 10**30}, "seed: give an integer from 0 to"),
    ("/v1/completions", {"prompt": "hi", "stop": ["x"] * 5}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
     "tools: this server does not implement"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content"),
])
def test_bad_bodies_are_400_naming_the_field(server, path, body, words):
    r = httpx.post(server.url + path, json={"model": "tiny-qwen3", "max_tokens": 2, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(words), r.text


@pytest.mark.parametrize("path, raw", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800"}], "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": "\\udfff", "max_tokens": 2}'),
])
def test_a_lone_surrogate_is_400_not_500(server, path, raw):
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text


def test_text_parts_answer_as_the_same_string(server):
    c = client(server)
    kw = {"model": "tiny-qwen3", "max_tokens": 12, "temperature": 0}
    plain = c.chat.completions.create(messages=[{"role": "user", "content": "Rivers\nflow"}], **kw)
    parts = c.chat.completions.create(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Rivers"}, {"type": "text", "text": "flow"}]}], **kw)
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


def reference_greedy(prompt_ids: list[int], steps: int) -> list[np.ndarray]:
    """log-softmax (float64) of the transformers fp32 model's next-token logits at each greedy step,
    recomputed from the whole sequence each time (no cache)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir(), torch_dtype=torch.float32).eval()
    ids, out = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            out.append(torch.log_softmax(logits, -1).numpy())
            ids.append(int(out[-1].argmax()))
    return out


def test_logprobs_whole_and_streamed_equal_the_transformers_fp32_reference(server):
    """Greedy completions and chat with logprobs: each token, its log-probability and the top alternatives
    are the transformers fp32 model's own (computed here, without edgeinfer), whole and streamed alike."""
    from edgeinfer.run.generation.text import TextCodec

    codec, steps, top = TextCodec(model_dir()), 8, 3
    tokenizer = codec.tokenizer

    def word(i: int) -> str:
        return tokenizer.decode([int(i)], skip_special_tokens=False)

    kw = {"model": "tiny-qwen3", "max_tokens": steps, "temperature": 0, "ignore_eos": True}
    ref = reference_greedy(codec.encode(PROMPTS[3]), steps)
    want_ids = [int(r.argmax()) for r in ref]
    whole = httpx.post(server.url + "/v1/completions", json={**kw, "prompt": PROMPTS[3], "logprobs": top},
                       timeout=120).json()["choices"][0]["logprobs"]
    assert whole["tokens"] == [word(i) for i in want_ids]
    np.testing.assert_allclose(whole["token_logprobs"], [r[i] for r, i in zip(ref, want_ids)], atol=2e-4)
    for got, r in zip(whole["top_logprobs"], ref):
        best = np.argsort(-r)[:top]
        assert list(got) == [word(i) for i in best]
        np.testing.assert_allclose(list(got.values()), r[best], atol=2e-4)
    assert whole["text_offset"] == list(np.cumsum([0] + [len(t) for t in whole["tokens"]])[:-1])
    with httpx.stream("POST", server.url + "/v1/completions", timeout=120,
                      json={**kw, "prompt": PROMPTS[3], "logprobs": top, "stream": True}) as s:
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    for key in ("tokens", "text_offset"):
        assert [x for b in streamed for x in b[key]] == whole[key]
    assert [list(x) for b in streamed for x in b["top_logprobs"]] == [list(x) for x in whole["top_logprobs"]]
    np.testing.assert_allclose([x for b in streamed for x in b["token_logprobs"]], whole["token_logprobs"],
                               atol=1e-6)

    messages = [{"role": "user", "content": PROMPTS[4]}]
    ref = reference_greedy(codec.encode_chat(messages), steps)
    want_ids = [int(r.argmax()) for r in ref]
    body = {**kw, "messages": messages, "logprobs": True, "top_logprobs": top}
    content = httpx.post(server.url + "/v1/chat/completions", json=body,
                         timeout=120).json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [word(i) for i in want_ids]
    for e, r, i in zip(content, ref, want_ids):
        assert e["logprob"] == pytest.approx(r[i], abs=2e-4)
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
        best = np.argsort(-r)[:top]
        assert [t["token"] for t in e["top_logprobs"]] == [word(j) for j in best]
        np.testing.assert_allclose([t["logprob"] for t in e["top_logprobs"]], r[best], atol=2e-4)
    c = client(server)
    chunks = c.chat.completions.create(messages=messages, stream=True, logprobs=True, top_logprobs=top,
                                       model="tiny-qwen3", max_tokens=steps, temperature=0,
                                       extra_body={"ignore_eos": True})
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e["token"] for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=1e-6)
    plain = c.chat.completions.create(messages=messages, model="tiny-qwen3", max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None


def test_logprobs_are_the_log_softmax_of_the_bundles_logits(tiny_qwen3_host_bundle):
    """Seeded sampling on the onnxruntime bundle through the serving scheduler: every entry equals a numpy
    log-softmax of the logits the decoder itself gives for that sequence, the sampled token's (not
    always the most likely) and the top 4; the entries' bytes spell the text (a random token may split a
    character: both replace it alike)."""
    import edgeinfer
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.serve.decoder_scheduler import Scheduler

    with edgeinfer.load(tiny_qwen3_host_bundle, slots=1) as g:
        ids = g.codec.encode(PROMPTS[2])
        opts = GenerationOptions(max_new_tokens=10, temperature=1.5, seed=3, ignore_eos=True, logprobs=4)
        sched, entries, text = Scheduler(g), [], ""
        sched.add("a", ids, opts)
        while sched.busy:
            for e in sched.step():
                entries += e.logprobs or []
                text += e.text
        tokens = g.generate_ids(ids, opts.with_(logprobs=None)).token_ids  # the same seed: the same tokens
        d = g.decoder
        d.reset(0)
        logits = d.prefill(0, np.asarray(ids, dtype=np.int64))
        picked_best = []
        for tok, entry in zip(tokens, entries):
            row = np.asarray(logits, dtype=np.float64).reshape(-1)
            ref = row - row.max() - np.log(np.exp(row - row.max()).sum())
            assert entry["logprob"] == pytest.approx(ref[tok], abs=1e-6)
            best = np.argsort(-ref)[:4]
            np.testing.assert_allclose([t["logprob"] for t in entry["top_logprobs"]], ref[best], atol=1e-6)
            picked_best.append(tok == best[0])
            logits = d.decode([0], np.asarray([tok], dtype=np.int64))[0]
        d.reset(0)
    assert len(entries) == len(tokens) == 10 and not all(picked_best)  # sampled: some token was not the top one
    assert bytes(b for e in entries for b in e["bytes"]).decode("utf-8", "replace") == text


def test_full_queue_is_429_and_disconnects_free_the_slots(server):
    """Four streams hold the four slots, two wait, the next request gets 429 with Retry-After; closing the
    streams mid-way cancels their sequences (no end-to-end latency recorded) and frees every slot."""
    e2e_before = metric(server, "edgeinfer_request_e2e_seconds_count")
    body = {"model": "tiny-qwen3", "prompt": "The city", "max_tokens": 200, "ignore_eos": True, "stream": True,
            "temperature": 0}
    http = httpx.Client(timeout=120)
    streams = [http.stream("POST", server.url + "/v1/completions", json=body) for _ in range(SLOTS + QUEUE)]
    opened = [s.__enter__() for s in streams]
    try:
        wait_for(lambda: decoder_state(server)["running"] == SLOTS and decoder_state(server)["waiting"] == QUEUE)
        assert metric(server, "edgeinfer_kv_slots_used") == SLOTS
        assert metric(server, "edgeinfer_kv_slots_total") == SLOTS
        assert metric(server, "edgeinfer_sequences_waiting") == QUEUE
        r = http.post(server.url + "/v1/completions", json={**body, "stream": False})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        next(opened[0].iter_lines())  # the first stream is generating
    finally:
        for s in streams:
            s.__exit__(None, None, None)
        http.close()
    wait_for(lambda: metric(server, "edgeinfer_kv_slots_used") == 0 and metric(server,
                                                                              "edgeinfer_sequences_waiting") == 0)
    assert metric(server, "edgeinfer_request_e2e_seconds_count") == e2e_before
    assert decoder_state(server)["running"] == 0
    assert stream_text(client(server), "hi", False, 4, temperature=0)  # the slots serve again


def test_killed_worker_ends_its_streams_with_an_error_and_restarts(server, generator):
    c = client(server)
    pid = decoder_state(server)["pid"]
    errors: list[Exception] = []
    started = threading.Barrier(3)

    def run() -> None:
        chunks = c.completions.create(model="tiny-qwen3", prompt="The city", max_tokens=200,
                                      stream=True, temperature=0, extra_body={"ignore_eos": True})
        try:
            for i, _ in enumerate(chunks):
                if i == 1:
                    started.wait(60)
        except openai.APIError as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(60)
    import os

    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(60)
    assert len(errors) == 2 and all("decoder worker" in str(e) for e in errors)
    wait_for(lambda: decoder_state(server)["state"] == "ready" and decoder_state(server)["pid"] != pid)
    assert decoder_state(server)["restarts"] == 1
    assert stream_text(c, PROMPTS[2], False, 16, temperature=0) == solo(generator, PROMPTS[2], False, 16)


def test_sigterm_during_streams_finishes_them_and_exits_0(minilm_onnx, tmp_path):
    """With an embedding bundle served beside the decoder (both keep working), SIGTERM lets the running
    streams finish and the server exits 0."""
    from edgeinfer.testing.serve import minilm_bundle

    ort = minilm_bundle(minilm_onnx, tmp_path / "minilm-ort", "onnxruntime")
    server = ServerProc([ort, model_dir()], "--slots", "2", "--ctx", str(CTX), "--threads", "1",
                        log=tmp_path / "log")
    c = client(server)
    assert sorted(m.id for m in c.models.list().data) == ["minilm-ort", "tiny-qwen3"]
    vectors = c.embeddings.create(model="minilm-ort", input=["a sentence", "another one"]).data
    assert len(vectors) == 2 and len(vectors[0].embedding) == 384
    done: list[str] = []
    started = threading.Barrier(3)

    def run() -> None:
        chunks = c.completions.create(model="tiny-qwen3", prompt="The city", max_tokens=60, stream=True,
                                      temperature=0, extra_body={"ignore_eos": True})
        n = 0
        for ch in chunks:
            n += 1
            if n == 2:
                started.wait(60)
            if ch.choices and ch.choices[0].finish_reason:
                done.append(ch.choices[0].finish_reason)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(60)
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert server.terminate() == 0, server.output()[-2000:]
    assert done == ["length", "length"]


def test_generation_timeout_is_504_or_an_error_event_and_frees_the_slot(tmp_path):
    """Past --generation-timeout-s a whole answer is OpenAI's 504 error, a stream ends with an error event and
    ``[DONE]``; either way the sequence is cancelled: the one slot serves the next request."""
    server = ServerProc([model_dir()], "--slots", "1", "--ctx", "1024", "--threads", "1",
                        "--generation-timeout-s", "0.5", log=tmp_path / "log")
    body = {"model": "tiny-qwen3", "prompt": "The city", "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    try:
        e2e_before = metric(server, "edgeinfer_request_e2e_seconds_count")
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 504, r.text
        assert r.json()["error"]["type"] == "timeout" and "per-request timeout" in r.json()["error"]["message"]
        wait_for(lambda: metric(server, "edgeinfer_kv_slots_used") == 0, timeout=10)
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as s:
            events = [ln.removeprefix("data: ") for ln in s.iter_lines() if ln.startswith("data: ")]
        assert s.status_code == 200 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["type"] == "timeout"
        assert all("error" not in json.loads(e) for e in events[:-2])
        wait_for(lambda: metric(server, "edgeinfer_kv_slots_used") == 0, timeout=10)
        assert metric(server, "edgeinfer_request_e2e_seconds_count") == e2e_before  # neither ran to its end
        short = client(server).completions.create(model="tiny-qwen3", prompt="hi", max_tokens=4, temperature=0)
        assert short.choices[0].finish_reason in ("stop", "length") and short.usage.completion_tokens >= 1
    finally:
        server.terminate()
