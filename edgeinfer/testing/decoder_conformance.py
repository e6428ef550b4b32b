"""The decoder conformance kit: one test class every backend that runs language models
runs against itself, whether it gives step primitives or a native loop.

Usage, in a plugin's tests::

    from edgeinfer.testing import DecoderConformance

    class TestMyNpuDecoders(DecoderConformance):
        backend_name = "mynpu"
        load_options = {"precision": "fp16"}

The expected tokens come from calling transformers' ``generate`` (greedy, fp32) on the
kit's trained test model directly — not from edgeinfer's own loop.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer
from edgeinfer.contract import registry as plugins
from edgeinfer.contract import remote_code
from edgeinfer.contract.backend import Backend
from edgeinfer.contract.decoder import NativeDecoder, StepDecoder
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.contract.records import Needs
from edgeinfer.errors import InputError
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.text import TextCodec

PROMPTS = ("The licence grants", "Permission is hereby granted", "def main():")
NEW_TOKENS = 32


def reference_greedy(model_dir: Path, prompt_ids: list[int], new_tokens: int, dtype: str = "float32") -> list[int]:
    """transformers' own greedy ``generate`` (fp32 unless ``dtype`` names another torch dtype): the golden
    reference for decoders. Computed once per process for the same directory (as its files are now), prompt,
    length and dtype: every decoder kit class and many tests ask for the same tokens."""
    trust = remote_code.allowed(model_dir)  # refuses (raises) on every call, not only the first
    return list(_greedy(str(Path(model_dir).resolve()), _files_now(Path(model_dir)), tuple(map(int, prompt_ids)),
                        new_tokens, dtype, trust))


def _files_now(model_dir: Path) -> tuple:
    """(name, size, mtime) of the directory's files: a directory rewritten in place is computed again."""
    return tuple(sorted((p.name, st.st_size, st.st_mtime_ns) for p in model_dir.iterdir()
                        if p.is_file() and (st := p.stat())))


@functools.lru_cache(maxsize=256)
def _greedy(model_dir: str, _files: tuple, prompt_ids: tuple[int, ...], new_tokens: int, dtype: str,
            trust: bool) -> tuple[int, ...]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                 trust_remote_code=trust).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([list(prompt_ids)]), max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=model.generation_config.eos_token_id, pad_token_id=0)
    return tuple(out[0, len(prompt_ids):].tolist())


class DecoderConformance:
    backend_name: str = ""
    device: str | None = None
    load_options: dict[str, Any] = {}
    context: int = 128
    kv_bytes_per_element: int = 4  # the KV cache's element size (4: fp32)
    exact_greedy: bool = True  # lossless paths must reproduce the reference token for token
    chunked_prefill_atol: float = 1e-3  # fp16 graphs: a few fp16 ulps (another summation order) are allowed

    @classmethod
    def model_dir(cls) -> Path:
        from edgeinfer.testing.llm import model_dir

        return model_dir()

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls) -> Backend:
        plugins.reset()
        return edgeinfer.backend(cls.backend_name)

    @pytest.fixture(scope="class")
    @classmethod
    def generator(cls, backend: Backend):
        d = backend.load_decoder(cls.model_dir(), device=cls.device, context=cls.context, **cls.load_options)
        with Generator(d, TextCodec(cls.model_dir())) as g:
            yield g

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, generator: Generator) -> dict[str, list[int]]:
        return {p: reference_greedy(cls.model_dir(), generator.prompt_ids(p), NEW_TOKENS) for p in PROMPTS}

    # --- the contract -------------------------------------------------------------------------

    def test_backend_declares_decoders(self, backend: Backend) -> None:
        assert type(backend).capable("decoders")
        assert plugins.contract_problem(type(backend)) is None

    def test_decoder_facts(self, generator: Generator) -> None:
        d, cfg = generator.decoder, json.loads((self.model_dir() / "config.json").read_text())
        assert isinstance(d, (StepDecoder, NativeDecoder)) and d.backend_name == self.backend_name
        assert d.context == self.context and d.slots >= 1
        assert d.vocab_size == cfg["vocab_size"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        per_slot = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * self.context
        assert d.kv_cache_bytes == per_slot * self.kv_bytes_per_element * d.slots

    @pytest.mark.parametrize("prompt", PROMPTS)
    def test_greedy_tokens_match_transformers(self, generator: Generator, expected: dict, prompt: str) -> None:
        got = generator.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids
        want = expected[prompt]
        if self.exact_greedy:
            assert got == want
        else:
            assert got[:4] == want[:4], "lossy paths must still agree on the first tokens"

    def test_same_request_twice_gives_the_same_tokens(self, generator: Generator) -> None:
        a = generator.generate(PROMPTS[0], max_new_tokens=12).token_ids
        generator.generate(PROMPTS[1], max_new_tokens=12)
        assert generator.generate(PROMPTS[0], max_new_tokens=12).token_ids == a

    def test_seeded_sampling_is_reproducible(self, generator: Generator) -> None:
        opts = GenerationOptions(max_new_tokens=16, temperature=1.0, top_k=20, seed=5)
        assert generator.generate(PROMPTS[1], opts).token_ids == generator.generate(PROMPTS[1], opts).token_ids

    def test_stream_joins_to_the_text(self, generator: Generator) -> None:
        s = generator.stream(PROMPTS[2], max_new_tokens=NEW_TOKENS)
        assert "".join(s) == s.result.text
        m = s.result.metrics
        assert m.generated_tokens == len(s.result.token_ids) and m.kv_cache_bytes == generator.kv_cache_bytes

    def test_chunked_prefill_equals_one_prefill(self, generator: Generator) -> None:
        d = generator.decoder
        if not isinstance(d, StepDecoder):
            pytest.skip("native-loop backends prefill inside their own loop")
        ids = np.asarray(generator.prompt_ids(PROMPTS[1]), dtype=np.int64)
        d.reset(0)
        whole = d.prefill(0, ids)
        d.reset(0)
        for i in range(0, len(ids), 3):
            parts = d.prefill(0, ids[i : i + 3])
        d.reset(0)
        np.testing.assert_allclose(parts, whole, rtol=1e-3, atol=self.chunked_prefill_atol)

    def test_positions_past_the_context_are_refused(self, generator: Generator) -> None:
        with pytest.raises(InputError, match="context"):
            generator.generate("word " * (self.context + 8), max_new_tokens=1)
        d = generator.decoder
        if isinstance(d, StepDecoder):
            d.reset(0)
            with pytest.raises(InputError, match="context"):
                d.prefill(0, np.zeros(self.context + 1, dtype=np.int64))
            d.reset(0)

    def test_unknown_option_is_an_input_error(self, backend: Backend) -> None:
        with pytest.raises(InputError, match="unknown option"):
            backend.load_decoder(self.model_dir(), device=self.device, context=16, no_such_option=1)

    # --- deploying decoders (the "decoder_deploy" capability), when the backend has it -------------

    def test_declared_architectures_hold_the_converted_test_model(self, backend: Backend) -> None:
        """``decoders.architectures`` (what plan and deploy let through) is None or model_type names, and names
        the test model's, which ``convert_decoder`` converts below."""
        if not type(backend).capable("decoder_deploy"):
            pytest.skip(f"{self.backend_name} does not convert decoders (no convert_decoder)")
        archs = backend.decoders.architectures
        if archs is None:
            pytest.skip(f"{self.backend_name} declares no architectures: the conversion decides")
        assert isinstance(archs, tuple) and all(isinstance(a, str) and a == a.strip() and a for a in archs), archs
        model_type = json.loads((self.model_dir() / "config.json").read_text())["model_type"]
        assert backend.decoders.refusal(model_type, backend.name) is None
        assert "not 'no_such_architecture'" in backend.decoders.refusal("no_such_architecture", backend.name)

    def test_declared_build_runtimes_are_well_formed(self, backend: Backend) -> None:
        """``decoders.runtimes`` (the board runtimes besides its own that ``convert_decoder`` builds for, given the
        convert option ``runtime``), ``decoders.builds`` (runtimes it builds as its own on every board) and
        ``cannot_build``, which plan and deploy ask before choosing a runtime."""
        cls = type(backend)
        if not cls.capable("decoder_deploy"):
            assert "convert_decoder" in cls.cannot_build("decoder")
            pytest.skip(f"{self.backend_name} does not convert decoders (no convert_decoder)")
        assert cls.cannot_build("decoder") is None, "a backend builds decoders for its own board runtime"
        assert isinstance(cls.cannot_build("decoder", "no-such-runtime"), str)
        if cls.decoders.runtimes:
            assert "runtime" in cls.decoders.convert_options, "deploy passes the convert option runtime"
        for runtime, needs in {**cls.decoders.runtimes, **cls.decoders.builds}.items():
            assert isinstance(runtime, str) and runtime.strip() == runtime and runtime, runtime
            assert needs is None or (isinstance(needs, Needs) and needs.module.isidentifier()), needs
            why = cls.cannot_build("decoder", runtime)
            assert why is None or (isinstance(why, str) and "\n" not in why and why.strip()), why

    def test_unknown_convert_option_is_an_input_error(self, backend: Backend, tmp_path: Path) -> None:
        if not type(backend).capable("decoder_deploy"):
            pytest.skip(f"{self.backend_name} does not convert decoders (no convert_decoder)")
        with pytest.raises(InputError, match="unknown option 'no_such_option'"):
            scheme = backend.decoders.schemes[0]
            backend.quantize_decoder(self.model_dir(), scheme, 16, tmp_path / "d", no_such_option=1)
        assert not (tmp_path / "d").exists()  # refused before anything was written

    def test_converted_decoder_opens_and_keeps_its_context(self, backend: Backend, expected: dict,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
        """``convert_decoder`` writes an artifact ``open_decoder`` takes: the same greedy tokens (lossless
        schemes), stamped, and a context larger than the one it was built for refused."""
        if not type(backend).capable("decoder_deploy"):
            pytest.skip(f"{self.backend_name} does not convert decoders (no convert_decoder)")
        from edgeinfer.contract import stamp

        scheme = backend.decoders.schemes[0]
        out = tmp_path_factory.mktemp("convert-decoder") / "decoder"
        backend.quantize_decoder(self.model_dir(), scheme, self.context, out)
        assert (stamp.read(out) or {}).get("context") == self.context
        d = backend.load_decoder(out, device=self.device, context=self.context, **self.load_options)
        with Generator(d, TextCodec(self.model_dir())) as g:
            got = g.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS).token_ids
        lossless = scheme == "fp32" and self.exact_greedy
        assert got == expected[PROMPTS[0]] if lossless else got[:4] == expected[PROMPTS[0]][:4]
        with pytest.raises(InputError, match="context"):
            backend.load_decoder(out, device=self.device, context=self.context + 1, **self.load_options)
