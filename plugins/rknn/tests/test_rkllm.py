"""The RKLLM binding (edgeinfer_rknn.rkllm) against a STAND-IN librkllmrt.so built from rkllm_standin.c.

No RK3588 here and the real runtime is aarch64-only: the stand-in implements the same functions and
structures with a documented, deterministic token stream (see the C file), so expected tokens are
derived in this file from that rule, not from the binding.
"""

from __future__ import annotations

import ctypes as C
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from edgeinfer_rknn import rkllm
from edgeinfer_rknn.rkllm_convert import build_args, convert_rkllm

import edgeinfer
from edgeinfer.contract import NativeDecoder
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import BackendUnavailableError, InputError, ModelError

VOCAB, EOS = 3072, 2  # standin_lib (conftest.py) builds the stand-in runtime from rkllm_standin.c


@pytest.fixture
def lib_env(standin_lib, monkeypatch) -> Path:
    monkeypatch.setenv(rkllm.LIB_ENV, str(standin_lib))
    return standin_lib


def _model(tmp_path: Path, delay_us: int = 0, eos: int = EOS, name: str = "m.rkllm") -> Path:
    p = tmp_path / name
    p.write_text(f"RKLLM-STANDIN vocab={VOCAB} eos={eos} delay_us={delay_us}")
    return p


def _expected(prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """The stand-in's rule: t1 = (Σ prompt · 31 + 7) mod V, t_{k+1} = (t_k · 31 + 7) mod V, EOS included."""
    out, tok = [], (sum(prompt) * 31 + 7) % VOCAB
    while len(out) < n:
        out.append(tok)
        if tok == eos:
            break
        tok = (tok * 31 + 7) % VOCAB
    return out


def _load(path: Path, **kw):
    return edgeinfer.backend("rknn").load_decoder(path, context=kw.pop("context", 256), **kw)


def test_struct_layouts_match_the_c_side(standin_lib):
    lib = C.CDLL(str(standin_lib))
    sizes = (C.c_size_t * 10)()
    lib.standin_sizes(sizes)
    ours = [C.sizeof(rkllm.RKLLMParam), C.sizeof(rkllm.RKLLMInput), C.sizeof(rkllm.RKLLMInferParam),
            C.sizeof(rkllm.RKLLMResult), C.sizeof(rkllm.RKLLMCallback), C.sizeof(rkllm.RKLLMExtendParam),
            rkllm.RKLLMParam.extend_param.offset, rkllm.RKLLMInput.u.offset + rkllm._InputUnion.token_input.offset,
            rkllm.RKLLMResult.perf.offset, C.sizeof(rkllm.RKLLMMultiModalInput)]
    assert list(sizes) == ours


def test_streams_tokens_through_the_callback(lib_env, tmp_path):
    d = _load(_model(tmp_path, eos=-1))
    assert isinstance(d, NativeDecoder) and d.backend_name == "rknn"
    seen: list[int] = []
    prompt = [5, 17, 300]
    native = d.generate_native(prompt, GenerationOptions(max_new_tokens=12), lambda t: seen.append(t) or True)
    assert seen == _expected(prompt, 12)
    assert any(t % 5 == 0 for t in seen)  # tokens the stand-in sends in the WAITING state count too
    assert native["generated_tokens"] == 12 and native["prefill_tokens"] == 3
    d.close()


def test_stops_at_eos_and_maps_options(lib_env, tmp_path, standin_lib):
    prompt = [1]
    eos = _expected(prompt, 4)[3]  # the 4th token of this prompt's stream
    d = _load(_model(tmp_path, eos=eos))
    seen: list[int] = []
    opts = GenerationOptions(max_new_tokens=50, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.2)
    d.generate_native(prompt, opts, lambda t: seen.append(t) or True)
    assert seen == _expected(prompt, 4) and seen[-1] == eos
    lib = C.CDLL(str(standin_lib))
    lib.standin_last_sampling.restype = rkllm.RKLLMSamplingParam
    lib.standin_last_infer.restype = rkllm.RKLLMInferParam
    lib.standin_last_param.restype = rkllm.RKLLMParam
    s, inf, par = lib.standin_last_sampling(), lib.standin_last_infer(), lib.standin_last_param()
    assert (s.top_k, s.temperature, s.repeat_penalty) == (20, pytest.approx(0.7), pytest.approx(1.2))
    assert s.top_p == pytest.approx(0.9)
    assert inf.max_new_tokens == 50 and inf.keep_history == 0 and inf.mode == rkllm.INFER_GENERATE
    assert par.max_context_len == 256 and par.is_async is False
    d.generate_native(prompt, GenerationOptions(max_new_tokens=3), lambda t: True)  # greedy: top-k 1
    assert lib.standin_last_sampling().top_k == 1
    d.close()


def test_consumer_stop_pauses_the_run(lib_env, tmp_path):
    d = _load(_model(tmp_path, eos=-1))
    seen: list[int] = []
    native = d.generate_native([9], GenerationOptions(max_new_tokens=40), lambda t: seen.append(t) or len(seen) < 5)
    assert seen == _expected([9], 5) and native["stopped_by_consumer"] is True
    # the next request starts from a fresh history
    again: list[int] = []
    d.generate_native([9], GenerationOptions(max_new_tokens=3), lambda t: again.append(t) or True)
    assert again == _expected([9], 3)
    d.close()


def test_abort_from_another_thread(lib_env, tmp_path):
    d = _load(_model(tmp_path, delay_us=20_000, eos=-1))  # 20 ms a token: 1000 tokens would take 20 s
    seen: list[int] = []
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(d.generate_native([3], GenerationOptions(max_new_tokens=1000),
                                                                     lambda k: seen.append(k) or True)))
    t.start()
    while len(seen) < 3:
        time.sleep(0.005)
    d.abort()
    t.join(timeout=10)
    assert not t.is_alive() and 3 <= len(seen) < 1000
    assert seen == _expected([3], len(seen)) and out["generated_tokens"] == len(seen)
    d.close()


def test_destroy_releases_the_handle_once(lib_env, tmp_path, standin_lib):
    lib = C.CDLL(str(standin_lib))
    before = lib.standin_live_handles()
    d = _load(_model(tmp_path))
    assert lib.standin_live_handles() == before + 1
    d.close()
    d.close()
    assert lib.standin_live_handles() == before


def test_metrics_come_from_the_perf_stats():
    perf = rkllm.RKLLMPerfStat(prefill_time_ms=250.0, prefill_tokens=100, generate_time_ms=400.0,
                               generate_tokens=20, memory_usage_mb=512.0)
    m = rkllm.perf_metrics(perf)
    assert m["ttft_ms"] == 250.0 and m["prefill_tokens_per_s"] == pytest.approx(400.0)
    assert m["tpot_ms"] == pytest.approx(20.0) and m["decode_tokens_per_s"] == pytest.approx(50.0)
    assert m["peak_rss_bytes"] == 512 * 2**20
    empty = rkllm.perf_metrics(rkllm.RKLLMPerfStat())
    assert empty["decode_tokens_per_s"] is None and empty["tpot_ms"] is None


def test_generator_streams_text_and_reports_runtime_metrics(lib_env, tmp_path):
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec
    from edgeinfer.testing.llm import model_dir

    shutil.copy(model_dir() / "config.json", tmp_path / "config.json")  # as a decoder bundle holds it
    g = Generator(_load(_model(tmp_path, eos=-1)), TextCodec(model_dir()))
    assert g.decoder.vocab_size == VOCAB
    r = g.generate_ids([10, 20], GenerationOptions(max_new_tokens=6, ignore_eos=True))
    assert r.token_ids == _expected([10, 20], 6) and r.finish_reason == "length"
    assert r.metrics.generated_tokens == 6 and r.metrics.decode_tokens_per_s > 0
    g.decoder.close()


def test_init_failure_is_one_line(lib_env, tmp_path):
    bad = tmp_path / "bad.rkllm"
    bad.write_text("not a model")
    with pytest.raises(ModelError, match="rkllm_init failed for bad.rkllm"):
        _load(bad)
    with pytest.raises(InputError, match="model file not found"):
        _load(tmp_path / "missing.rkllm")


def test_missing_library_is_backend_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv(rkllm.LIB_ENV, str(tmp_path / "librkllmrt.so"))
    with pytest.raises(BackendUnavailableError, match="RKLLM runtime library") as e:
        _load(_model(tmp_path))
    assert "rkllm-runtime" in e.value.one_line()


def test_load_without_the_runtime_exits_3_with_one_line(monkeypatch, tmp_path):
    code = ("import sys; from edgeinfer.errors import EdgeInferError\nimport edgeinfer\n"
            f"try:\n edgeinfer.backend('rknn').load_decoder({str(_model(tmp_path))!r})\n"
            "except EdgeInferError as e:\n print(e.one_line(), file=sys.stderr); sys.exit(e.exit_code)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, rkllm.LIB_ENV: str(tmp_path / "nope.so")})
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1


def test_toolkit_absent_says_how_to_get_it(tmp_path):
    with pytest.raises(BackendUnavailableError, match="RKLLM toolkit") as e:
        convert_rkllm(tmp_path, "w8a8", 1024, tmp_path)
    assert "rkllm-toolkit/packages" in e.value.one_line()


def test_build_args_follow_the_vendor_table():
    a = build_args("w8a8", "rk3588", 4096, None)
    assert (a["quantized_dtype"], a["target_platform"], a["max_context"], a["num_npu_core"]) == ("W8A8", "RK3588",
                                                                                                4096, 3)
    assert build_args("w4a16_g128", "RK3576", 2048, "d.json")["quantized_algorithm"] == "grq"
    with pytest.raises(InputError, match="rk3588 supports w8a8"):
        build_args("w4a16", "rk3588", 1024, None)
