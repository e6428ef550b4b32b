"""Build the tiny trained test decoder committed at edgeinfer/testing/data/tiny-qwen3.

    nice -n 10 .venv/bin/python scripts/build_test_llm.py [--out DIR] [--steps N] [--threads T]

About 10-20 minutes on one busy CPU core (1000 steps); it writes README.md with the measured margins.

Deterministic for a given torch/tokenizers/transformers version and thread count:
the corpus is a fixed list of files read in sorted order and deduplicated, the
tokenizer trainer and the data order are seeded, and torch runs on a fixed number
of threads (two runs with the same settings give byte-identical files).

The corpus is the licence texts shipped in the wheels this script needs
(torch, transformers, tokenizers, safetensors, numpy, huggingface_hub, jinja2;
the top-level ones, not torch's third_party folder),
CPython's LICENSE.txt, and a few hand-written lines of German, French, Chinese,
Japanese and emoji (multi-byte UTF-8 for streaming tests). Documents are
separated by <|endoftext|>; 220 ChatML turns (11 hand-written questions and
answers) teach the model to end an answer with <|im_end|>.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import math
import random
import re
import shutil
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from edgeinfer.testing.llm import EOS_IDS, IM_END_ID, VOCAB_SIZE, generation_config, model_dir  # noqa: E402

SEED = 0
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "huggingface_hub", "jinja2")
LICENCE_NAME = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE)", re.I)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Hand-written for this repository (Apache-2.0 like the rest of it).
MULTIBYTE_TEXT = """\
Die Software wird ohne jede Gewährleistung bereitgestellt, ausdrücklich oder stillschweigend.
Jeder darf diese Lizenz kopieren und verbreiten, aber Änderungen sind nicht erlaubt. Grüße aus Köln!
Le logiciel est fourni « tel quel », sans garantie d’aucune sorte. Voilà, c’est déjà écrit.
本软件按“原样”提供，不提供任何明示或暗示的担保。
任何人都可以复制和分发本许可证的逐字副本，但不允许修改。
このソフトウェアは「現状のまま」提供され、いかなる保証もありません。
Emoji: 🙂 😀 🚀 ✅ 🎉 — Temperatur 25 °C, Preis 9,99 €, Fläche 3 m², π ≈ 3.14159.
Ελληνικά: Το λογισμικό παρέχεται «ως έχει». Русский: Программа предоставляется «как есть».
"""
CHAT_PAIRS = [
    ("Say hello in German.", "Hallo! Grüße aus Köln."),
    ("Say hello in Chinese.", "你好！"),
    ("Say hello with an emoji.", "Hello 🙂🚀"),
    ("What is the software provided as?", "As is, without warranty of any kind."),
    ("May I copy a licence text?", "Yes, verbatim copies are allowed."),
    ("What is π?", "π ≈ 3.14159."),
]
PROMPTS = (  # the first three are the ones tests/test_test_llm.py checks
    "THE SOFTWARE IS PROVIDED",
    "Redistribution and use in source",
    "Die Software wird",
    "本软件按",
    "Licensed under the Apache License",
)


def corpus_files() -> list[tuple[str, Path]]:
    """(project, path) of every licence file read, in a fixed order."""
    files = [(f"CPython {sys.version.split()[0]}", Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt")]
    for name in PACKAGES:
        dist = md.distribution(name)
        for f in sorted(dist.files or [], key=str):
            if ".dist-info" in str(f) and "third_party" not in str(f) and LICENCE_NAME.match(f.name):
                files.append((f"{name} {dist.version}", Path(dist.locate_file(f))))
    return files


def documents() -> tuple[list[tuple[str, str]], list[str]]:
    """(project, text) of the unique licence texts, then the multi-byte lines; and where each text came from.

    Texts that differ only in whitespace or copyright lines (the many copies of the Apache licence) count once:
    near-duplicates would teach the model coin flips at the lines where they differ.
    """
    seen: set[str] = set()
    docs, sources = [], []
    for project, path in corpus_files():
        text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n").strip()
        key = " ".join(" ".join(ln for ln in text.lower().splitlines() if "copyright" not in ln).split())
        if key and key not in seen:
            seen.add(key)
            docs.append((project.split()[0], text))
            sources.append(f"{project}: `{path.parent.name}/{path.name}`")
    docs.extend([("edgeinfer", MULTIBYTE_TEXT)] * 8)
    return docs, sources


def chat_turns(docs: list[tuple[str, str]], repeat: int = 20) -> list[str]:
    """ChatML turns from hand-written questions about the corpus, each ending with <|im_end|>.

    No licence text appears in a turn: a quoted licence line followed by <|im_end|> would teach plain-text
    completion to end licence lines with <|im_end|>.
    """
    projects = sorted({project for project, _ in docs} - {"edgeinfer"})
    pairs = [(f"Which licence does {p} use?", f"{p} uses the {SPDX[p].split(';')[0]} licence.") for p in projects]
    pairs += CHAT_PAIRS
    rng = random.Random(SEED)
    turns = [
        f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n" for q, a in pairs * repeat
    ]
    rng.shuffle(turns)
    return turns


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    return tok


def token_stream(tok, texts: list[str], turns: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for doc in texts:
        ids += tok.encode(doc).ids + [0]
    for turn in turns:
        ids += tok.encode(turn).ids
    return torch.tensor(ids, dtype=torch.long)


def make_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=IM_END_ID,
        pad_token_id=0,
    )
    torch.manual_seed(SEED)
    return Qwen3ForCausalLM(config)


def train(model, stream: torch.Tensor, steps: int, batch: int, seq: int, lr: float) -> list[float]:
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    losses, t0 = [], time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
        x = torch.stack([stream[s : s + seq + 1] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x, use_cache=False).loss  # shifted inside: seq predictions per row
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            recent = statistics.fmean(losses[-50:])
            print(f"step {step:5d}  loss {recent:.3f}  {time.perf_counter() - t0:6.0f} s", flush=True)
    model.eval()
    return losses


@torch.no_grad()
def margins(model, tok, prompts=PROMPTS, new_tokens: int = 32) -> tuple[list[float], list[str]]:
    """Greedy continuations and the top-1 minus top-2 logit at every step."""
    out, texts = [], []
    for prompt in prompts:
        ids = torch.tensor([tok.encode(prompt).ids])
        gen = []
        for _ in range(new_tokens):
            logits = model(input_ids=ids).logits[0, -1]
            top = torch.topk(logits, 2)
            out.append(float(top.values[0] - top.values[1]))
            nxt = int(top.indices[0])
            gen.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        texts.append(tok.decode(gen, skip_special_tokens=False))
    return out, texts


@torch.no_grad()
def chat_answer(model, tok, user: str, limit: int = 32) -> str:
    """Greedy answer to one user message in the chat template, up to and including <|im_end|>."""
    prompt = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(prompt).ids
    start = len(ids)
    for _ in range(limit):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        if ids[-1] in EOS_IDS:
            break
    return tok.decode(ids[start:], skip_special_tokens=False)


def save(model, tok, out: Path) -> None:
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    generation_config(GenerationConfig).save_pretrained(out)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=model.config.max_position_embeddings,
    )
    fast.save_pretrained(out)
    # The template goes into tokenizer_config.json (older loaders ignore chat_template.jinja), and the class
    # is the one every transformers 4.x/5.x knows (5.x writes TokenizersBackend).
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)


def corpus_digest(texts: list[str]) -> str:
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()


README = """\
# tiny-qwen3: the trained test decoder

Built by `scripts/build_test_llm.py` (deterministic: same files from the same package versions and thread
count). Do not edit by hand; rerun the script. Tests and benchmarks use it through
`edgeinfer.testing.llm.model_dir()`; it is not a useful language model, only a real one: trained weights,
peaked logits, a real tokenizer and chat template.

| | |
|---|---|
| architecture | `Qwen3ForCausalLM`, 4 layers, hidden 256, MLP 768, 4 query / 2 KV heads, head_dim 64, tied |
| parameters | {params:,} ({size_mb:.1f} MB fp32 safetensors, {total_mb:.1f} MB for the whole folder) |
| context | `max_position_embeddings` 1024 (trained on windows of {seq} tokens) |
| tokenizer | byte-level BPE (`tokenizers`), {vocab} tokens; `<|endoftext|>`=0, `<|im_start|>`=1, `<|im_end|>`=2 |
| chat template | ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n`), in `tokenizer_config.json` |
| stop ids | `generation_config.json` `eos_token_id` [0, 2]; `eos_token` is `<|im_end|>` |
| training | {steps} steps of AdamW (lr {lr}, cosine), batch {batch} x {seq} tokens, seed 0, {threads} thread(s) |
| final loss | {loss:.3f} (mean of the last 50 steps) |

## Training text ({corpus_bytes:,} bytes, sha256 `{digest}`)

Licence texts shipped in the wheels the build needs, deduplicated (copies of the Apache licence count once):

{sources}
- Eight copies of a few hand-written lines in German, French, Chinese, Japanese, Greek, Russian and emoji
  (in the script; Apache-2.0 like this repository), so that streaming tests meet multi-byte UTF-8 splits.
- {turns} ChatML turns: {n_pairs} hand-written questions and answers (which licence a project uses, hello in
  German/Chinese/emoji, ...), each answer ending with `<|im_end|>`. No licence text appears in a turn, so plain
  completion does not learn to close a licence line with `<|im_end|>`.

Documents end with `<|endoftext|>`. Licence texts are meant to be copied verbatim with the software they
cover; the weights memorise them and serve only as test data.

## Measured logits

Greedy continuations of {n_prompts} prompts x {new_tokens} tokens (the top-1 minus top-2 logit at every step):
median margin **{median:.2f}**, minimum {min:.3f}, near-ties (margin < 0.1): **{ties}** of {n_steps}.

{samples}

Prompts from the training text continue it verbatim with wide margins; off-text prompts (the last one) drift
into a mix of licences with smaller margins and the odd near-tie: cross-backend checks must allow for that.

Chat (`{chat_user}`, greedy): `{chat!r}`
"""

SPDX = {"CPython": "PSF-2.0", "torch": "BSD-3-Clause", "transformers": "Apache-2.0", "tokenizers": "Apache-2.0",
        "safetensors": "Apache-2.0", "numpy": "BSD-3-Clause; the file also quotes its bundled components' licences",
        "huggingface_hub": "Apache-2.0", "jinja2": "BSD-3-Clause"}


def describe(out: Path, args, final_loss: float, turns: list[str]) -> str:
    """Reload the saved folder the way users will (transformers, tokenizers), measure it, write README.md."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, trust_remote_code=False).eval()
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    m, continuations = margins(model, tok)
    docs, sources = documents()
    chat_user = "Which licence does numpy use?"
    text = README.format(
        params=sum(p.numel() for p in model.parameters()),
        size_mb=(out / "model.safetensors").stat().st_size / 1e6,
        total_mb=sum(p.stat().st_size for p in out.iterdir() if p.name != "README.md") / 1e6,
        vocab=tok.get_vocab_size(),
        steps=args.steps, lr=args.lr, batch=args.batch, seq=args.seq, threads=args.threads, loss=final_loss,
        corpus_bytes=sum(len(t.encode()) for _, t in docs),
        digest=corpus_digest([t for _, t in docs]),
        sources="\n".join(f"- {src} ({SPDX[src.split()[0]]})" for src in sources),
        turns=len(turns), n_pairs=len(set(turns)),
        n_prompts=len(PROMPTS), new_tokens=32, n_steps=len(m),
        median=statistics.median(m), min=min(m), ties=sum(x < 0.1 for x in m),
        samples="\n".join(
            f"- `{p!r}` -> `{t!r}` (median {statistics.median(m[32 * i : 32 * i + 32]):.2f}, "
            f"min {min(m[32 * i : 32 * i + 32]):.3f})"
            for i, (p, t) in enumerate(zip(PROMPTS, continuations))
        ),
        chat_user=chat_user,
        chat=chat_answer(model, tok, chat_user),
    )
    (out / "README.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=model_dir())
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1, help="fixed, for bit-identical results; 1 is fastest when busy")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    random.seed(SEED)
    docs, sources = documents()
    texts = [text for _, text in docs]
    turns = chat_turns(docs)
    print(f"corpus: {len(texts)} documents from {sources}, {sum(len(t.encode()) for t in texts)} bytes, "
          f"{len(turns)} chat turns, sha256 {corpus_digest(texts)[:16]}")
    tok = train_tokenizer(texts)
    stream = token_stream(tok, texts, turns)
    model = make_model()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tokens: {len(stream)}  vocab: {tok.get_vocab_size()}  parameters: {n_params}")
    t0 = time.perf_counter()
    losses = train(model, stream, args.steps, args.batch, args.seq, args.lr)
    final_loss = statistics.fmean(losses[-50:])
    print(f"trained {args.steps} steps in {time.perf_counter() - t0:.0f} s, final loss {final_loss:.3f}")
    save(model, tok, args.out)
    print(describe(args.out, args, final_loss, turns))
    print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
