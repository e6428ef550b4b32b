"""Small decoder LLMs for tests and benchmarks.

``model_dir()`` is a tiny *trained* Qwen3 (4 layers, hidden 256, GQA 4/2, tied
embeddings, byte-level BPE of 3072 tokens, ChatML template) committed under
``data/tiny-qwen3``; ``scripts/build_test_llm.py`` rebuilds it. Its logits are
peaked, so greedy tokens are a meaningful cross-backend check.

``random_llama`` and ``random_qwen3`` build random-initialised models in seconds
that reuse the same tokenizer: a Llama for cross-architecture tests, a larger
Qwen3 (hundreds of millions of parameters) for memory and speed benchmarks.
Random weights give flat logits: never compare their greedy tokens across
backends without allowing for near-ties.

torch and transformers are imported inside the functions so that importing
``edgeinfer.testing`` stays light.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from edgeinfer.contract import cache

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# <|endoftext|> ends a document, <|im_end|> ends a chat turn: generation stops at either.
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
EOS_IDS = [ENDOFTEXT_ID, IM_END_ID]
VOCAB_SIZE = 3072


def model_dir() -> Path:
    """The committed trained test decoder (Hugging Face directory: config, safetensors, tokenizer)."""
    return Path(__file__).resolve().parent / "data" / "tiny-qwen3"


#: a chat template of nested ``range`` loops (10**10 steps): it renders for ever unless rendering is bounded
TEMPLATE_BOMB = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"


def with_template_bomb(out: Path, source: Path | None = None) -> Path:
    """A copy of ``source`` (default: the committed tiny decoder) at ``out`` whose chat template is
    :data:`TEMPLATE_BOMB`."""
    shutil.copytree(source or model_dir(), out)
    (out / "chat_template.jinja").write_text(TEMPLATE_BOMB)
    return out


def default_cache_dir() -> Path:
    """Where on-demand models go: $EDGEINFER_CACHE or ~/.cache/edgeinfer, under test-llm/."""
    root = os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer"
    return Path(root) / "test-llm"


def random_llama(
    out_dir: Path,
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    max_positions: int = 1024,
    seed: int = 0,
) -> Path:
    """A random-initialised ``LlamaForCausalLM`` (untied embeddings, unlike the Qwen3) with the test tokenizer."""
    from transformers import LlamaConfig

    shape = _shape(layers, hidden, heads, kv_heads, intermediate, max_positions)
    config = LlamaConfig(**shape, tie_word_embeddings=False)
    return _save_random("LlamaForCausalLM", config, Path(out_dir), seed)


def random_qwen3(
    out_dir: Path | None = None,
    *,
    layers: int = 16,
    hidden: int = 1024,
    heads: int = 16,
    kv_heads: int = 8,
    intermediate: int = 3072,
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """A random-initialised ``Qwen3ForCausalLM`` with the test tokenizer (defaults: ~204 M parameters, ~816 MB fp32).

    With ``out_dir=None`` it goes to a cache folder named after its shape and is built only once.
    """
    from transformers import Qwen3Config

    name = f"qwen3-random-l{layers}-h{hidden}-a{heads}-kv{kv_heads}-i{intermediate}-p{max_positions}-s{seed}"
    out = Path(out_dir) if out_dir is not None else default_cache_dir() / name
    config = Qwen3Config(**_shape(layers, hidden, heads, kv_heads, intermediate, max_positions),
                         tie_word_embeddings=True)
    if out_dir is not None:
        return _save_random("Qwen3ForCausalLM", config, out, seed)
    with cache.locked(out):  # a concurrent session waits for this one's model
        if not (out / "model.safetensors").exists():
            _save_random("Qwen3ForCausalLM", config, out, seed)
    return out


def _shape(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, max_positions: int) -> dict:
    """Config fields shared by the random models: their shape and the test tokenizer's special ids."""
    return {
        "vocab_size": VOCAB_SIZE, "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads, "max_position_embeddings": max_positions,
        "bos_token_id": ENDOFTEXT_ID, "eos_token_id": IM_END_ID, "pad_token_id": ENDOFTEXT_ID,
    }


def _save_random(arch: str, config, out: Path, seed: int) -> Path:
    import torch
    import transformers
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).eval()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    generation_config(GenerationConfig).save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (model_dir() / name).exists():
            shutil.copyfile(model_dir() / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def generation_config(cls):
    """Greedy by default; stops at <|endoftext|> or <|im_end|>."""
    return cls(bos_token_id=ENDOFTEXT_ID, eos_token_id=list(EOS_IDS), pad_token_id=ENDOFTEXT_ID, do_sample=False)
