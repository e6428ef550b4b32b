"""``edgeinfer bench`` on a decoder and ``edgeinfer profile`` on encoders and decoders.

The heavy cases run the CLI in this process (``edgeinfer.cli.invoke``: torch and onnxruntime are
imported once per session); so do the bad-input cases (``edgeinfer.testing.cli.run_cli``: the output at the
file descriptors), which must fail before any model loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.cli import invoke
from edgeinfer.contract.backend import Session, TensorSpec
from edgeinfer.errors import InputError
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.llm import model_dir

LLM = str(model_dir())
FAST = ["--ctx", "64", "--threads", "1"]


def _run(capsys, *args: str) -> tuple[int, dict | None, str]:
    rc = invoke(list(args))
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 and "--json" in args else None), err


# --- bench ----------------------------------------------------------------------------------------


def test_prompts_have_exactly_the_asked_token_counts():
    from edgeinfer.run.generation.bench import prompt_of_length
    from edgeinfer.run.generation.text import TextCodec

    codec = TextCodec(model_dir())
    sentences = (Path(__file__).parents[1] / "edgeinfer" / "data" / "golden_sentences.txt").read_text()
    for n in (1, 16, 600):  # 600: longer than one pass over the text
        ids = prompt_of_length(codec, n)
        assert len(ids) == n and ids == prompt_of_length(codec, n)
    assert sentences.startswith(codec.decode(prompt_of_length(codec, 16)))  # real text, not filler ids


def test_default_lengths_are_capped_and_asked_lengths_refused():
    from edgeinfer.run.generation.bench import plan_lengths

    assert plan_lengths(2048, 64, None) == ([16, 128, 512], [])
    lengths, notes = plan_lengths(200, 64, None)  # 136 positions left for a prompt
    assert lengths == [16, 128, 136] and len(notes) == 1 and "512 capped to 136" in notes[0]
    assert plan_lengths(200, 64, [8, 8, 100]) == ([8, 100], [])
    with pytest.raises(InputError, match="prompt length 137 \\+ 64 new tokens exceed the context of 200"):
        plan_lengths(200, 64, [16, 137])
    with pytest.raises(InputError, match="no room for a prompt"):
        plan_lengths(64, 64, None)


def test_bench_decoder_json_output_file_and_plot(capsys, tmp_path):
    plot, out = tmp_path / "bench.png", tmp_path / "bench.json"
    rc, report, err = _run(capsys, "bench", LLM, "--backend", "onnxruntime", *FAST, "--prompt-lengths", "8,16",
                           "--new-tokens", "4", "--repeat", "2", "--plot", str(plot), "-o", str(out), "--json")
    assert rc == 0, err
    assert report["kind"] == "decoder" and report["backend"] == "onnxruntime" and report["context"] == 64
    assert [r["prompt_tokens"] for r in report["results"]] == [8, 16]
    for row in report["results"]:
        assert row["new_tokens"] == 4 and len(row["runs"]) == 2
        for key in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "tpot_ms_p50", "tpot_ms_p99",
                    "peak_rss_bytes"):
            assert row[key] > 0, key
        assert row["tpot_ms_p99"] >= row["tpot_ms_p50"]
        # 4 layers x K and V x 2 KV heads x head_dim 64 x 64 positions x 4 bytes
        assert row["kv_cache_bytes"] == 4 * 2 * 2 * 64 * 64 * 4
        assert "others_busy_cpus" in row  # None where the runs were too short to say (measure.MIN_LOAD_WINDOW_S)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(out.read_text()) == report and report["plot"] == str(plot)


def test_bench_decoder_caps_the_default_lengths_to_the_context(capsys):
    rc, report, err = _run(capsys, "bench", LLM, "--backend", "onnxruntime", "--ctx", "32", "--threads", "1",
                           "--new-tokens", "4", "--repeat", "1", "--json")
    assert rc == 0, err
    assert [r["prompt_tokens"] for r in report["results"]] == [16, 28]  # 128 and 512 → 32 - 4
    assert any("capped to 28" in n for n in report["notes"])


def test_bench_decoder_refuses_asked_lengths_over_the_context(capsys):
    rc, _, err = _run(capsys, "bench", LLM, "--backend", "onnxruntime", "--ctx", "32", "--prompt-lengths", "40",
                      "--new-tokens", "4")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1
    assert "prompt length 40 + 4 new tokens exceed the context of 32" in lines[0]


# --- profile --------------------------------------------------------------------------------------


def _check_ops(section: dict, top: int) -> None:
    ops = section["ops"]
    assert 0 < len(ops) <= top and section["ops_profiled"] >= len(ops)
    times = [o["time_ms"] for o in ops]
    assert times == sorted(times, reverse=True) and times[0] > 0
    assert section["ops_note"] is None


def test_profile_encoder_json(capsys, minilm_onnx):
    rc, report, err = _run(capsys, "profile", str(minilm_onnx), "--top", "3", "--repeat", "2", "--json")
    assert rc == 0, err
    assert report["kind"] == "encoder" and report["backend"] == "onnxruntime" and report["runs"] == 2
    assert report["latency_ms"]["p50"] > 0 and report["input"]["shapes"]["input_ids"] == [1, 128]
    _check_ops(report, 3)
    assert report["ops_profiled"] > 3  # MiniLM has hundreds of nodes: --top cut the list


@pytest.mark.parametrize("backend", ["onnxruntime", "transformers"])
def test_profile_decoder_json_per_phase(capsys, backend):
    rc, report, err = _run(capsys, "profile", LLM, "--backend", backend, *FAST, "--top", "4", "--repeat", "2",
                           "--prompt-length", "12", "--json")
    assert rc == 0, err
    assert report["kind"] == "decoder" and report["backend"] == backend and report["prompt_tokens"] == 12
    assert set(report["phases"]) == {"prefill", "decode"}
    assert report["phases"]["prefill"]["tokens"] == 12 and report["phases"]["decode"]["tokens"] == 1
    for phase in report["phases"].values():
        assert phase["latency_ms"]["p50"] > 0
        _check_ops(phase, 4)


def test_profile_decoder_bundle_takes_threads_not_ctx(capsys, tiny_qwen3_host_bundle):
    rc, report, err = _run(capsys, "profile", str(tiny_qwen3_host_bundle), "--threads", "1", "--top", "2",
                           "--repeat", "2", "--prompt-length", "6", "--json")
    assert rc == 0, err
    assert report["kind"] == "decoder" and report["phases"]["prefill"]["tokens"] == 6
    _check_ops(report["phases"]["decode"], 2)
    rc, _, err = _run(capsys, "profile", str(tiny_qwen3_host_bundle), "--ctx", "32")
    assert rc == 2 and "--ctx applies to a decoder model directory" in err


def test_profile_table_says_when_a_backend_gives_no_op_times():
    from edgeinfer.run.profile import profile_encoder

    class NoProfilerSession(Session):  # a session whose SDK has no profiler: real NumPy work, no op_times
        backend_name = "no-profiler"

        def infer(self, feeds):
            return {"y": np.tanh(feeds["x"])}

    s = NoProfilerSession([TensorSpec("x", (1, 4), "float32")], [TensorSpec("y", (1, 4), "float32")], "CPU")
    report = profile_encoder(s, Path("model.onnx"), top=5, repeat=2)
    assert report["ops"] == [] and report["ops_profiled"] == 0
    assert "gives no per-operator times" in report["ops_note"] and "no-profiler" in report["ops_note"]
    assert report["latency_ms"]["p50"] > 0


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["profile", LLM, "--top", "0"], 2, "--top must be at least 1"),
        (["profile", LLM, "--prompt-length", "0"], 2, "--prompt-length must be at least 1"),
        (["bench", LLM, "--prompt-lengths", "0"], 2, "--prompt-lengths '0' is not a comma-separated list"),
        (["bench", LLM, "--prompt-lengths", "8,x"], 2, "--prompt-lengths '8,x' is not a comma-separated list"),
        (["bench", LLM, "--new-tokens", "0"], 2, "--new-tokens must be at least 1"),
        (["profile", "no/such/model"], 2, "model not found"),
        # an unknown backend is "unavailable" (exit 3) everywhere in edgeinfer, with the install hint
        (["bench", LLM, "--backend", "nosuch"], 3, "unknown backend 'nosuch'"),
        (["profile", LLM, "--backend", "nosuch"], 3, "unknown backend 'nosuch'"),
    ],
)
def test_bad_input_is_one_line(args, code, needle, capfd):
    p = run_cli(capfd, *args)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == code, p.stderr
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
    assert p.stdout == ""


def test_onnxruntime_op_times_leave_generation_unchanged():
    import edgeinfer
    from edgeinfer.contract.generation import GenerationOptions

    opts = GenerationOptions(max_new_tokens=8)
    with edgeinfer.load(model_dir(), backend="onnxruntime", ctx=64, threads=1) as gen:
        ids = gen.prompt_ids("Permission is hereby granted")
        before = gen.generate_ids(ids, opts).token_ids
        for phase in ("prefill", "decode"):
            ops = gen.decoder.op_times(phase, np.asarray(ids, dtype=np.int64))
            assert {"MatMul", "GroupQueryAttention"} <= {o.op_type for o in ops}
        assert gen.generate_ids(ids, opts).token_ids == before  # profiling shared the KV buffers
