"""What a decoder's tokenizer costs serve's HTTP process: for real vocabularies (llama.cpp's vocabulary test files,
``models/ggml-vocab-*.gguf`` of the llama.cpp source the llamacpp plugin fetches, turned into Hugging Face
tokenizer.json files by transformers' GGUF reader), a fresh interpreter with the HTTP process's imports loads
``TextCodec`` as serve does and reports its RSS before, its peak (VmHWM: the parse) and its RSS after
``malloc_trim(0)`` (what serve keeps: ``edgeinfer/serve/child.py`` ``return_freed_heap``); and what llama.cpp's
own vocabulary of the same file holds in a process (``vocab_only`` load: a llamacpp worker and llama-server
hold it; ``runtimes.yaml`` ``llama.cpp.vocab_bytes_per_token``). Issue 30 §2: the
peer bench's test tokenizer (3,072 tokens) hides this; the served plan adds it per vocabulary entry
(``edgeinfer/data/serve_memory.json`` ``tokenizer_per_token_bytes``, docs/planner.md "Served decoder memory").

    python bench/tokenizer_memory.py [--vocabs qwen2 llama-bpe ...]

Writes bench/results/tokenizer_memory.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

VOCABS = ("qwen2", "llama-bpe", "deepseek-llm", "gpt-2", "phi-3", "llama-spm")
MIB = 2**20

LLAMA_PROBE = """
import json, sys
from pathlib import Path
from edgeinfer_llamacpp.decoder import init_backend
from edgeinfer_llamacpp.vocab import GgufVocabulary

def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024

init_backend()
before = status("VmRSS")
vocab = GgufVocabulary(Path(sys.argv[1]))
print(json.dumps({"vocab_size": vocab.vocab_size, "kept": status("VmRSS") - before}))
"""

PROBE = """
import json, sys
from edgeinfer.serve import app  # noqa: F401 - the HTTP process's imports
from edgeinfer.serve.child import return_freed_heap
from edgeinfer.run.generation.text import TextCodec

def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024

before = status("VmRSS")
codec = TextCodec(sys.argv[1])
codec.encode("The quick brown fox jumps over the lazy dog. " * 20)
loaded, peak = status("VmRSS"), status("VmHWM")
return_freed_heap()
print(json.dumps({"vocab_size": codec.vocab_size, "rss_before": before, "rss_loaded": loaded, "peak": peak,
                  "rss_trimmed": status("VmRSS")}))
"""


def tokenizer_dir(name: str, work: Path) -> Path:
    """The Hugging Face tokenizer of ``ggml-vocab-NAME.gguf`` (converted once, cached)."""
    from edgeinfer_llamacpp.convert import source_tree

    out = work / name
    if (out / "tokenizer.json").is_file():
        return out
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source_tree() / "models", gguf_file=f"ggml-vocab-{name}.gguf")
    tok.save_pretrained(out)
    return out


def measure(name: str, work: Path) -> dict:
    d = tokenizer_dir(name, work)
    r = subprocess.run([sys.executable, "-c", PROBE, str(d)], capture_output=True, text=True, check=True)
    m = json.loads(r.stdout)
    size = (d / "tokenizer.json").stat().st_size
    row = {"vocab": name, "vocab_size": m["vocab_size"], "tokenizer_json_bytes": size,
           "parse_peak_bytes": m["peak"] - m["rss_before"], "loaded_bytes": m["rss_loaded"] - m["rss_before"],
           "kept_bytes": m["rss_trimmed"] - m["rss_before"]}
    row["parse_peak_per_token_bytes"] = round(row["parse_peak_bytes"] / row["vocab_size"], 1)
    row["kept_per_token_bytes"] = round(row["kept_bytes"] / row["vocab_size"], 1)
    # llama.cpp's own vocabulary of the same file (a llamacpp worker and llama-server hold it), loaded vocab_only
    from edgeinfer_llamacpp.convert import source_tree

    gguf = source_tree() / "models" / f"ggml-vocab-{name}.gguf"
    r = subprocess.run([sys.executable, "-c", LLAMA_PROBE, str(gguf)], capture_output=True, text=True, check=True)
    ll = json.loads(r.stdout.splitlines()[-1])
    row.update(llama_cpp_vocab_size=ll["vocab_size"], llama_cpp_vocab_bytes=ll["kept"],
               llama_cpp_per_token_bytes=round(ll["kept"] / ll["vocab_size"], 1))
    print(json.dumps(row))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocabs", nargs="*", default=list(VOCABS), help="ggml-vocab-NAME.gguf names")
    args = ap.parse_args()
    from edgeinfer.contract import cache

    work = cache.root() / "bench" / "tokenizers"
    rows = [measure(n, work) for n in args.vocabs]
    keys = ("parse_peak_per_token_bytes", "kept_per_token_bytes", "llama_cpp_per_token_bytes")
    summary = {k: statistics.median(r[k] for r in rows) for k in keys}
    path = _common.write("tokenizer_memory", {"rows": rows, "median": summary, "unit": "bytes"})
    print(json.dumps(summary), f"\nwrote {path}")


if __name__ == "__main__":
    main()
