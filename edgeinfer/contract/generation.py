"""The options of one generation request, validated once for every backend."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from edgeinfer.errors import InputError, check_text

#: the largest seed every backend takes: OpenVINO GenAI's ``GenerationConfig.rng_seed`` is a ``size_t``
#: (https://docs.openvino.ai/2025/api/genai_api/_autosummary/openvino_genai.GenerationConfig.html), NumPy's
#: PCG64 takes any non-negative integer, RKLLM's sampling parameters have no seed
MAX_SEED = 2**64 - 1
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class GenerationOptions:
    """What to generate and when to stop. ``temperature == 0`` means greedy."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    repetition_penalty: float = 1.0  # 1.0: none (the CTRL paper's penalty, as transformers applies it)
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings; the text ends before the first one
    eos_token_ids: tuple[int, ...] | None = None  # None: the model's generation config
    ignore_eos: bool = False
    logprobs: int | None = None  # report each token's log-probability and this many top alternatives
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific, checked by the backend

    def __post_init__(self) -> None:
        _int_at_least("max_new_tokens", self.max_new_tokens, 1)
        _number_in("temperature", self.temperature, 0.0, 100.0)
        _int_at_least("top_k", self.top_k, 0)
        _number_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _number_in("repetition_penalty", self.repetition_penalty, 0.0, 100.0, low_open=True)
        if self.seed is not None:
            _int_at_least("seed", self.seed, 0)
            if self.seed > MAX_SEED:
                raise InputError(f"seed must be at most {MAX_SEED} (2**64 - 1), got {self.seed}")
        if self.logprobs is not None:
            _int_at_least("logprobs", self.logprobs, 0)
            if self.logprobs > MAX_TOP_LOGPROBS:
                raise InputError(f"logprobs must be at most {MAX_TOP_LOGPROBS} alternatives, got {self.logprobs}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        stop = tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise InputError("stop strings must be non-empty strings")
        for s in stop:
            check_text(s, "a stop string")
        object.__setattr__(self, "stop", stop)
        if self.eos_token_ids is not None:
            ids = tuple(self.eos_token_ids)
            for i in ids:
                _int_at_least("eos token id", i, 0)
            object.__setattr__(self, "eos_token_ids", ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **changes: Any) -> GenerationOptions:
        return replace(self, **changes)


def _int_at_least(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise InputError(f"{name} must be at least {low}, got {value}")


def _number_in(name: str, value: Any, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise InputError(f"{name} must be in {bound}, got {value}")
