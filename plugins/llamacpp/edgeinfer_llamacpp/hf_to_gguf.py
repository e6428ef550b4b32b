"""Run llama.cpp's ``convert_hf_to_gguf.py`` with the user's ``trust_remote_code`` choice; a script, run as a
subprocess by :mod:`edgeinfer_llamacpp.convert`, never imported by edgeinfer.

``python hf_to_gguf.py LLAMA_CPP_SRC TRUST [converter arguments ...]`` (TRUST: 0 or 1).

Two changes to the converter, made from outside (its files are llama.cpp's, unmodified):

- transformers' ``Auto*.from_pretrained`` get ``trust_remote_code=TRUST`` whatever the converter passes: it
  passes ``True`` to ``AutoTokenizer`` in several vocab paths (``conversion/base.py`` ``_set_vocab_hybriddna``,
  ``_set_vocab_qwen``, ``_set_vocab_interns1``; ``conversion/glm.py``, ``chatglm.py``, ``hunyuan.py`` ... in
  llama-cpp-python 0.3.36's vendor/llama.cpp), which would import Python files a model directory names;
- a byte-level BPE tokenizer whose pre-tokenizer is GPT-2's own (``ByteLevel`` with its regex, no normalizer)
  but whose hash the converter does not list (``get_vocab_base_pre`` raises "BPE pre-tokenizer was not
  recognized") is written with llama.cpp's ``gpt-2`` pre-tokenizer, which is that regex
  (``LLAMA_VOCAB_PRE_TYPE_GPT2`` in ``src/llama-vocab.cpp``). edgeinfer tokenizes with the model's
  tokenizer.json itself; this only lets the file be written (and llama.cpp's own tokenizer match it).
"""

import json
import os
import runpy
import sys
from pathlib import Path

AUTO_CLASSES = ("AutoTokenizer", "AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoProcessor")


def force_trust(trust: bool) -> None:
    import transformers

    for name in AUTO_CLASSES:
        cls = getattr(transformers, name)
        original = cls.from_pretrained.__func__

        def from_pretrained(klass, *args, _original=original, **kwargs):
            kwargs["trust_remote_code"] = trust
            return _original(klass, *args, **kwargs)

        cls.from_pretrained = classmethod(from_pretrained)


def plain_gpt2(model_dir: Path) -> bool:
    try:
        tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    pre = tok.get("pre_tokenizer") or {}
    return (tok.get("model", {}).get("type") == "BPE" and tok.get("normalizer") is None
            and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"))


def gpt2_fallback() -> None:
    from conversion.base import TextModel

    original = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if plain_gpt2(Path(self.dir_model)):
                print("edgeinfer: pre-tokenizer not listed by the converter; GPT-2's byte-level regex: gpt-2",
                      file=sys.stderr)
                return "gpt-2"
            raise

    TextModel.get_vocab_base_pre = get_vocab_base_pre


def main() -> None:
    src, trust, args = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory: nothing to download
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    force_trust(trust)
    gpt2_fallback()
    sys.argv = [str(src / "convert_hf_to_gguf.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
