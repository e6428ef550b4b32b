"""Prefill time: the time to the first token of a ``P``-token prompt (docs/planner.md#speed-model),

    TTFT(P) = t0 + P × 2 × params_active / (factor × peak_ops)        peak_ops = int8 TOPS (else fp16 TFLOPS)

``t0`` is what a request costs whatever its length (graph dispatch, the first decode step, sampling); the
factor is the fraction of peak compute a prompt token gets. Measured TTFTs of one model at 32 and 1,024 tokens
(OpenVINO's GPU tables) differ 1.4-24× where P alone says 32×: left out by source, a rate fitted without ``t0``
was 66 % off on them, with it 34 % (the median over the speed keys with a t0; bench/prefill_accuracy.py). Pure
arithmetic: bench/fit_speed.py and ``edgeinfer calibrate`` fit the constants here, the planner predicts
through here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from edgeinfer.errors import InputError

PROMPT_SPAN = 4.0  # t0 is fitted only where the rows' prompts span this factor (32 and 1,024 tokens: 32×)
PROMPTS = (128,)  # the prompt lengths a plan states its TTFT for, besides its context
UNIT_OPS = 1e12  # a board that states no peak: its factor is its effective tera-ops a second (calibrate fits it)


@dataclass(frozen=True)
class Measured:
    """One measured prefill: ``prompt`` tokens took ``ttft_s`` where a token takes ``s_per_token`` at peak
    compute (2 × params_active / peak_ops)."""

    prompt: int
    ttft_s: float
    s_per_token: float


def peak_ops(board, nominal: bool = False) -> float | None:
    """The board's peak compute, ops/s: int8 TOPS, else fp16 TFLOPS; where it claims neither, None (``nominal``:
    UNIT_OPS, so that a factor fitted on the board's own rows is its effective TOPS)."""
    return (board.int8_tops.value * 1e12 if board.int8_tops else
            board.fp16_tflops.value * 1e12 if board.fp16_tflops else UNIT_OPS if nominal else None)


def measured(board, params_active: int, prompt: int | None, ttft_ms: float | None = None,
             prefill_tokens_per_s: float | None = None, nominal: bool = False) -> Measured | None:
    """A row's prefill (its TTFT, else its prompt over its prefill rate), or None where it has none (or the board
    states no peak and not ``nominal``: bench/fit_speed.py's constants transfer between boards as fractions of
    their peaks; ``edgeinfer calibrate`` fits a board's own, ``nominal``)."""
    peak = peak_ops(board, nominal)
    if not (peak and params_active and prompt) or not (ttft_ms or prefill_tokens_per_s):
        return None
    ttft = ttft_ms / 1000 if ttft_ms else prompt / prefill_tokens_per_s
    return Measured(prompt, ttft, 2 * params_active / peak)


def ttft_seconds(c: dict, prompt: int, s_per_token: float) -> float:
    return (c.get("prefill_t0_ms") or 0.0) / 1000 + prompt * s_per_token / c["prefill_factor"]


def spans(ms: list[Measured]) -> bool:
    return bool(ms) and max(m.prompt for m in ms) >= PROMPT_SPAN * min(m.prompt for m in ms)


def fit(ms: list[Measured], t0_borrowed: tuple[float, str] | None = None) -> dict:
    """``prefill_factor``, ``prefill_t0_ms`` and how they were found (``prefill_fit``): ``t0`` and the factor by
    least squares on the relative error where the prompts span PROMPT_SPAN, else ``t0`` borrowed (seconds,
    where from; 0 without) and the factor the median of the rows'."""
    if not ms:
        return {"prefill_factor": None, "prefill_t0_ms": None, "prefill_fit": None, "prefill_rows": 0}
    if spans(ms):
        t0, slope = _line(ms)
        how = f"t0 fitted on prompts of {min(m.prompt for m in ms)}-{max(m.prompt for m in ms)} tokens"
    else:
        usable = t0_borrowed is not None and t0_borrowed[0] < min(m.ttft_s for m in ms)
        t0 = t0_borrowed[0] if usable else 0.0
        slope = statistics.median((m.ttft_s - t0) / (m.prompt * m.s_per_token) for m in ms)
        how = (f"t0 borrowed from {t0_borrowed[1]}" if usable else
               "t0 0: prompts of one length and no t0 to borrow" if t0_borrowed is None else
               f"t0 0: the t0 of {t0_borrowed[1]} is longer than a measured TTFT")
    c = {"prefill_factor": round(1 / slope, 5), "prefill_t0_ms": round(t0 * 1000, 3), "prefill_fit": how,
         "prefill_rows": len(ms)}
    c["prefill_fit_median_abs_pct_error"] = round(statistics.median(errors(c, ms)), 2)
    return c


def _line(ms: list[Measured]) -> tuple[float, float]:
    """(t0 s, seconds per token at factor 1 / factor) minimising the squared relative error; t0 >= 0 and the
    slope > 0 (TTFTs that fall as prompts grow fit a rate alone)."""
    a = [(1 / m.ttft_s, m.prompt * m.s_per_token / m.ttft_s) for m in ms]
    s11, s12, s22 = sum(x * x for x, _ in a), sum(x * z for x, z in a), sum(z * z for _, z in a)
    b1, b2 = sum(x for x, _ in a), sum(z for _, z in a)
    det = s11 * s22 - s12 * s12
    t0 = (b1 * s22 - b2 * s12) / det if det else 0.0
    slope = (s11 * b2 - s12 * b1) / det if det else 0.0
    return (t0, slope) if t0 > 0 and slope > 0 else (0.0, b2 / s22)


def errors(c: dict, ms: list[Measured]) -> list[float]:
    """|predicted / measured TTFT − 1| in % per row."""
    return [abs(ttft_seconds(c, m.prompt, m.s_per_token) / m.ttft_s - 1) * 100 for m in ms]


def estimate(c: dict | None, board, params_active: int, ctx: int | None, prompt: int | None = None) -> dict:
    """The plan's prefill figures from constants ``c``: the rate a prompt token goes at once a request has
    started (``prefill_tokens_per_s``), ``prefill_t0_ms``, and the prompt lengths to give a TTFT for
    (``prompt``, else PROMPTS shorter than ``ctx`` and ``ctx``; none with ``ctx`` None: an encoder, which
    gives no first token); {} without constants. On a board that states no peak the factor is effective TOPS
    (UNIT_OPS: a calibrated profile's) and there is no fraction of a peak."""
    peak = peak_ops(board, nominal=True)
    if not (c and c.get("prefill_factor") and params_active):
        return {}
    return {"prefill_tokens_per_s": round(c["prefill_factor"] * peak / (2 * params_active), 2),
            "prefill_fraction_of_peak": c["prefill_factor"] if peak_ops(board) else None,
            "prefill_t0_ms": c.get("prefill_t0_ms") or 0.0,
            "ttft_prompts": () if ctx is None else (prompt,) if prompt else (*[n for n in PROMPTS if n < ctx], ctx)}


def checked(prompt: int | None, ctx: int, encoder: bool) -> int | None:
    """``plan --prompt``: a decoder's prompt of at most ``ctx`` tokens, else InputError."""
    if prompt is not None and encoder:
        raise InputError("--prompt goes with a decoder: an encoder gives no first token", "drop --prompt")
    if prompt is not None and prompt > ctx:
        raise InputError(f"--prompt {prompt} is longer than the context ({ctx} tokens)",
                         f"pass --prompt {ctx} or less, or --ctx {prompt} or more")
    return prompt


def ttft_ms(t0_ms: float, tokens_per_s: float, prompt: int) -> float:
    """A ``prompt``'s TTFT at a prefill rate (a paged plan's own) after ``t0_ms``."""
    return round(t0_ms + prompt / tokens_per_s * 1000, 1)
