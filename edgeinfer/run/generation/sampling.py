"""Choosing the next token from logits: greedy, or sampling with temperature, top-k,
top-p and a repetition penalty. Deterministic for a given seed.

The filters follow transformers' logits processors (``RepetitionPenaltyLogitsProcessor``,
``TopKLogitsWarper``, ``TopPLogitsWarper``; https://github.com/huggingface/transformers,
``src/transformers/generation/logits_process.py``) in the same order: penalty,
temperature, top-k, top-p.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import CheckFailed, ModelError


class Sampler:
    """One sequence's sampler: its own random stream, so concurrent sequences don't interact."""

    def __init__(self, options: GenerationOptions):
        self.options = options
        self.rng = np.random.Generator(np.random.PCG64(options.seed))

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        o = self.options
        penalty = o.repetition_penalty != 1.0 and len(history)
        if o.greedy and not penalty:  # the per-token common case: no float64 copy of the row
            return int(np.argmax(logits))
        scores = np.asarray(logits, dtype=np.float64).reshape(-1)
        if penalty:
            scores = penalize(scores, history, o.repetition_penalty)
        if o.greedy:
            return int(np.argmax(scores))
        scores = scores / o.temperature
        if o.top_k:
            scores = top_k(scores, o.top_k)
        if o.top_p < 1.0:
            scores = top_p(scores, o.top_p)
        probs = softmax(scores)
        return int(self.rng.choice(probs.size, p=probs))


def checked_logits(logits: np.ndarray, vocab_size: int, model: str, token: int, finite: bool = True) -> np.ndarray:
    """One position's logits as a float32 row over the vocabulary, refused when they cannot be sampled:
    NaN or Inf (broken weights or conversion; argmax would pick token 0, which is often EOS, so the answer
    would end empty and look fine) is CheckFailed, a row of the wrong width a ModelError. ``finite=False``
    leaves NaN to the caller (the decoder golden check records the logits and reports them itself)."""
    row = np.asarray(logits, dtype=np.float32).reshape(-1)
    if row.size != vocab_size:
        raise ModelError(f"model {model} gave {row.size} logits per token, but its vocabulary has {vocab_size} "
                         "tokens; its artifact and its config disagree: deploy or convert it again")
    if finite and not np.isfinite(row).all():
        raise CheckFailed(f"model {model} produced NaN/Inf logits (generated token {token + 1}); its weights or "
                          "its conversion are broken: check it with `edgeinfer golden`, or deploy it again",
                          kind="golden_failed")
    return row


def penalize(scores: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    out = scores.copy()
    ids = np.unique(np.asarray(history, dtype=np.int64))
    picked = out[ids]
    out[ids] = np.where(picked > 0, picked / penalty, picked * penalty)
    return out


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    if k >= scores.size:
        return scores
    kth = np.partition(scores, -k)[-k]
    return np.where(scores < kth, -np.inf, scores)


def top_p(scores: np.ndarray, p: float) -> np.ndarray:
    order = np.argsort(scores)[::-1]
    probs = softmax(scores[order])
    # keep the smallest prefix whose mass reaches p (always at least the top token)
    keep = np.cumsum(probs) - probs < p
    out = np.full_like(scores, -np.inf)
    out[order[keep]] = scores[order[keep]]
    return out


#: what a log-probability of -inf (a token the logits rule out) is reported as: JSON has no -Infinity
LOGPROB_FLOOR = -9999.0


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of ``token`` under the model's distribution (log-softmax of the raw logits,
    before temperature, filters and penalties, as vLLM reports by default) and the ``top`` most likely
    tokens with theirs, most likely first."""
    scores = np.asarray(logits, dtype=np.float64).reshape(-1)
    peak = np.max(scores)
    logp = scores - (peak + np.log(np.sum(np.exp(scores - peak))))
    best = np.argpartition(-logp, top - 1)[:top] if 0 < top < logp.size else np.arange(logp.size if top else 0)
    best = best[np.argsort(-logp[best], kind="stable")]
    return _floor(logp[token]), [(int(i), _floor(logp[i])) for i in best]


def _floor(x: float) -> float:
    return max(float(x), LOGPROB_FLOOR)


def softmax(scores: np.ndarray) -> np.ndarray:
    z = scores - np.max(scores)
    e = np.exp(z)
    return e / e.sum()


def top2_margin(logits: np.ndarray) -> float:
    """Top-1 minus top-2 logit: how close a greedy choice was to a tie."""
    two = np.partition(np.asarray(logits, dtype=np.float64).reshape(-1), -2)[-2:]
    return float(two[1] - two[0])
