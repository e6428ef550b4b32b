"""The llamacpp backend through the core: plan routes the host's llama.cpp runtime to it, deploy builds fp16 and
Q8_0 bundles with the decoder golden check (one deploy each per module), generate and bench run them, serve
batches two streams through llama.cpp's sequences."""

from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
import sys

import pytest

from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.decoder_conformance import reference_greedy
from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.serve import ServerProc

CTX = 256
PROMPTS = ("The licence grants", "Permission is hereby granted")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    from edgeinfer.deploy.decoder import deploy_decoder

    root = tmp_path_factory.mktemp("llamacpp-bundles")
    return {q: deploy_decoder(model_dir(), "host", root / q.replace(":", "-"), quant=q, runtime="llama.cpp", ctx=CTX)
            for q in ("fp16", "gguf:Q8_0")}


def test_plan_builds_the_host_llama_cpp_runtime_with_this_backend(capfd):
    r = run_cli(capfd, "plan", str(model_dir()), "--board", "host", "--runtime", "llama.cpp", "--json")
    build = json.loads(r.stdout)["build"]
    assert r.returncode == 0 and (build["runtime"], build["backend"], build["scheme"]) == ("llama.cpp", "llamacpp",
                                                                                           "fp16")
    assert build["buildable"]


@pytest.mark.parametrize("quant", ["gguf:Q8_0", "fp16"])
def test_the_served_plan_is_within_10_percent_of_the_measured_tree(tmp_path, quant):
    """bench/serve_footprint.py served the random Qwen3 (160 M) through this backend at 4 slots, prompts filling
    the 512-token context (serve_footprint-llamacpp-host-fill.json); the plan from its config alone, as the
    bench planned it, is within 10% of that tree's peak (it read 1.17 while activations counted 4 × 512 tokens:
    llama.cpp holds one n_ubatch for every sequence)."""
    from pathlib import Path

    from transformers import Qwen3Config

    from edgeinfer.planning.planner import plan
    from edgeinfer.testing.llm import _shape

    Qwen3Config(**_shape(12, 1024, 16, 8, 3200, 4096), tie_word_embeddings=True,
                architectures=["Qwen3ForCausalLM"]).to_json_file(tmp_path / "config.json")
    result = Path(__file__).parents[3] / "bench/results/serve_footprint-llamacpp-host-fill.json"
    row = next(r for r in json.loads(result.read_text())["rows"] if r["scheme"] == quant)
    assert (row["backend"], row["ctx"], row["slots"]) == ("llamacpp", 512, 4)
    p = plan(str(tmp_path), "host", quant=quant, ctx=512, batch=4, runtime="llama.cpp", suggest=False)
    assert 0.9 < p.to_dict()["memory"]["served"]["total_bytes"] / row["tree_peak_bytes"] < 1.1


def test_the_ascend_llama_cpp_cann_runtime_is_this_backends_and_needs_a_cann_build(capfd):
    r = run_cli(capfd, "plan", str(model_dir()), "--board", "atlas-800i-a2", "--runtime", "llama.cpp-cann", "--json")
    build = json.loads(r.stdout)["build"]
    assert build["runtime"] == "llama.cpp-cann" and not build["buildable"]  # this llama-cpp-python is CPU-only
    assert "-DGGML_CANN=on" in build["cannot_build"] and "never run here" in build["cannot_build"]


@pytest.mark.parametrize("quant", ["fp16", "gguf:Q8_0"])
def test_deploy_builds_a_golden_checked_gguf_bundle(bundles, quant):
    res = bundles[quant]
    m = res.manifest
    assert (m.backend, m.scheme, m.decoder["runtime"], m.decoder["context"]) == ("llamacpp", quant, "llama.cpp", CTX)
    assert res.golden["passed"] and (res.bundle / "decoder" / "model.gguf").read_bytes()[:4] == b"GGUF"
    if quant == "fp16":
        assert res.golden["token_agreement"] == 1.0


def test_generate_gives_the_reference_tokens_and_bench_runs(bundles, capfd):
    b16 = bundles["fp16"].bundle
    r = run_cli(capfd, "generate", str(b16), "--prompt", PROMPTS[0], "--max-new-tokens", "16", "--json")
    out = json.loads(r.stdout)
    from edgeinfer.run.generation.text import TextCodec

    ids = TextCodec(model_dir()).encode(PROMPTS[0])
    assert r.returncode == 0 and out["token_ids"] == reference_greedy(model_dir(), ids, 16)
    r = run_cli(capfd, "bench", str(bundles["gguf:Q8_0"].bundle), "--prompt-lengths", "16", "--new-tokens", "8",
                "--repeat", "1", "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["backend"] == "llamacpp", rep


def test_serve_streams_two_requests_at_once_as_generate_does(bundles, tmp_path):
    import httpx

    import edgeinfer

    b8 = bundles["gguf:Q8_0"].bundle
    with edgeinfer.load(b8) as gen:
        want = [gen.generate(p, max_new_tokens=12).text for p in PROMPTS]
    with ServerProc([b8], "--slots", "2", "--threads", "1", log=tmp_path / "log") as s:
        def complete(prompt: str) -> str:
            body = {"model": b8.name, "prompt": prompt, "max_tokens": 12, "temperature": 0}
            return httpx.post(s.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

        with cf.ThreadPoolExecutor(2) as pool:
            assert list(pool.map(complete, PROMPTS)) == want
    assert "positions reserved at start" in (tmp_path / "log").read_text()
    assert "; 1 CPU thread" in (tmp_path / "log").read_text()  # the --threads the worker runs with


def test_a_gguf_file_runs_as_it_is_with_its_tokenizer_next_to_it(bundles, tmp_path, capfd):
    import shutil

    gguf = tmp_path / "tiny-q8.gguf"
    shutil.copyfile(bundles["gguf:Q8_0"].bundle / "decoder" / "model.gguf", gguf)
    for f in bundles["gguf:Q8_0"].bundle.joinpath("tokenizer").iterdir():
        shutil.copyfile(f, tmp_path / f.name)
    r = run_cli(capfd, "generate", str(gguf), "--prompt", PROMPTS[0], "--max-new-tokens", "8", "--json")
    b = run_cli(capfd, "generate", str(bundles["gguf:Q8_0"].bundle), "--prompt", PROMPTS[0], "--max-new-tokens", "8",
                "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["token_ids"] == json.loads(b.stdout)["token_ids"]


def test_the_kv_dtype_option_sets_llama_cpps_cache_type(bundles):
    import edgeinfer

    backend, gguf = edgeinfer.backend("llamacpp"), bundles["fp16"].bundle / "decoder"
    sizes = {}
    for kv in ("fp16", "fp32", "q8_0"):
        d = backend.load_decoder(gguf, context=CTX, kv_dtype=kv)
        sizes[kv] = d.kv_cache_bytes
        d.close()
    assert sizes["fp32"] == 2 * sizes["fp16"] and sizes["q8_0"] == sizes["fp16"] * 34 // 64


def test_prefill_batch_of_prompts_of_different_lengths_equals_each_slot_alone(bundles):
    """Three prompts in one llama_decode (a sequence id per token) give each slot the logits, and the next decode
    step, that prefilling it alone gives."""
    import numpy as np

    import edgeinfer

    backend, gguf = edgeinfer.backend("llamacpp"), bundles["fp16"].bundle / "decoder"
    prompts = [np.arange(5, 5 + n, dtype=np.int64) for n in (3, 11, 7)]
    d = backend.load_decoder(gguf, context=CTX, slots=3)
    try:
        alone = [d.prefill(i, p) for i, p in enumerate(prompts)]
        step_alone = d.decode([0, 1, 2], np.array([1, 2, 3]))
        for i in range(3):
            d.reset(i)
        together = d.prefill_batch([0, 1, 2], prompts)
        step_together = d.decode([0, 1, 2], np.array([1, 2, 3]))
    finally:
        d.close()
    assert together.shape == (3, d.vocab_size)
    for i in range(3):
        assert int(np.argmax(together[i])) == int(np.argmax(alone[i]))
        np.testing.assert_allclose(together[i], alone[i], atol=2e-2)
    np.testing.assert_allclose(step_together, step_alone, atol=2e-2)


def test_a_lone_gguf_runs_with_llama_cpps_own_vocabulary_and_chat_template(bundles, tmp_path, capfd):
    """A .gguf with no tokenizer files next to it: tokenized, detokenized and chat-templated by llama.cpp from the
    file itself, it gives the tokens and text the bundle gives with the model's tokenizer.json."""
    import pickle
    import shutil

    from edgeinfer.run.generation.text import TextCodec
    from edgeinfer.run.loading import decoder_file_codec

    bundle = bundles["gguf:Q8_0"].bundle
    gguf = tmp_path / "lone" / "tiny-q8.gguf"
    gguf.parent.mkdir()
    shutil.copyfile(bundle / "decoder" / "model.gguf", gguf)
    own, hf = decoder_file_codec(gguf), TextCodec(bundle / "tokenizer")
    assert type(own).__name__ == "VocabularyCodec" and own.eos_token_ids == hf.eos_token_ids
    for text in ("The licence grants", "naïve café — 東京 ✓", "<|im_start|>user\nHi<|im_end|>"):
        assert own.encode(text) == hf.encode(text), text
        assert own.decode(hf.encode(text)) == hf.decode(hf.encode(text)), text
    chat = [{"role": "user", "content": "Hello"}]
    assert own.encode_chat(chat) == hf.encode_chat(chat)
    assert pickle.loads(pickle.dumps(own)).encode("Hello") == hf.encode("Hello")  # serve's request helpers
    for args in (["--prompt", PROMPTS[0]], ["--chat", "--prompt", "Hello"]):
        r = run_cli(capfd, "generate", str(gguf), *args, "--max-new-tokens", "8", "--json")
        b = run_cli(capfd, "generate", str(bundle), *args, "--max-new-tokens", "8", "--json")
        assert r.returncode == 0 and b.returncode == 0, r.stderr[-800:]
        got, want = json.loads(r.stdout), json.loads(b.stdout)
        assert (got["token_ids"], got["text"]) == (want["token_ids"], want["text"])
    r = run_cli(capfd, "bench", str(gguf), "--prompt-lengths", "16", "--new-tokens", "4", "--repeat", "1", "--json",
                "--board", "host")
    assert r.returncode == 0 and json.loads(r.stdout)["backend"] == "llamacpp", r.stderr[-800:]
    check = json.loads(r.stdout)["self_check"]  # planned from the file's own metadata (no config.json beside it)
    assert (check["runtime"], check["scheme"]) == ("llama.cpp", "gguf:Q8_0"), check
    assert [row["model"] for row in check["rows"]] == [str(gguf.resolve())], check  # what calibrate reads
    r = run_cli(capfd, "deploy", str(gguf), "--board", "host", "-o", str(tmp_path / "b"))
    line = r.stderr.strip()
    assert r.returncode == 2 and "\n" not in line and "runs as it is" in line and "--runtime llama.cpp" in line, line


def test_a_served_worker_loads_the_bindings_alone_and_keeps_llama_cpps_log_off_stderr(bundles):
    """The worker's load path (serve's decoder_worker.load_generator) in a fresh interpreter: llama-cpp-python's
    ctypes bindings without its package __init__ (the high-level Llama with jinja2 and diskcache: memory every
    served worker would carry), llama.cpp's INFO lines kept off stderr, and a later `import llama_cpp` still the
    whole package over the same bindings."""
    code = f"""
import sys
from edgeinfer.serve.decoder_worker import load_generator
gen = load_generator({str(bundles["gguf:Q8_0"].bundle)!r}, "llamacpp", None, {CTX}, 2)
print(sorted(m for m in ("jinja2", "diskcache", "sqlite3", "llama_cpp", "llama_cpp.llama") if m in sys.modules))
print(gen.generate("{PROMPTS[0]}", max_new_tokens=4).token_ids)
import llama_cpp
print(llama_cpp.__version__, llama_cpp.llama_cpp is sys.modules["llama_cpp.llama_cpp"], hasattr(llama_cpp, "Llama"))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded, ids, whole = r.stdout.splitlines()
    assert loaded == "[]", loaded
    assert len(json.loads(ids)) == 4
    assert whole.split()[1:] == ["True", "True"], whole
    # llama.cpp logs the model's metadata at INFO level while loading it ("llama_model_loader: ..."); not here
    assert "llama_model_loader" not in r.stderr and "llama_context" not in r.stderr, r.stderr[-2000:]


def test_deploy_with_a_q8_0_kv_cache_records_it_and_every_load_allocates_it(tmp_path):
    """llama.cpp picks its cache type at load (the backend's load option kv_dtype): ``deploy --option
    kv_dtype=q8_0`` plans it, checks golden on it, records it in the manifest, and opening the bundle allocates
    the planned bytes (34 a block of 32 values, against fp16's 64); the caller can still ask for another."""
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.planning.planner import plan
    from edgeinfer.run.bundle import open_generator

    out = tmp_path / "q8kv"
    res = deploy_decoder(model_dir(), "host", out, quant="gguf:Q8_0", runtime="llama.cpp", ctx=CTX,
                         options={"kv_dtype": "q8_0"})
    assert res.golden["passed"] is True and res.manifest.decoder["kv_dtype"] == "q8_0"
    planned = plan(str(model_dir()), "host", quant="gguf:Q8_0", runtime="llama.cpp", ctx=CTX, batch=2,
                   kv_dtype="q8_0", suggest=False).breakdown["kv_cache"]
    with open_generator(Bundle.open(out), slots=2) as g:
        assert g.decoder.kv_dtype == "q8_0" and g.decoder.kv_cache_bytes == planned
    with open_generator(Bundle.open(out), slots=2, kv_dtype="fp16") as g:
        assert g.decoder.kv_dtype == "fp16" and g.decoder.kv_cache_bytes * 34 == planned * 64
