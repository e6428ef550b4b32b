"""Checked reads of integer keys of a Hugging Face config.json (shared by every config reader)."""

from __future__ import annotations

from edgeinfer.errors import ModelError

MAX_DIM = 2**40  # no real model comes near; larger values are corruption and overflow the arithmetic
MAX_LAYERS = 100_000  # planners and the paging model walk the layers one by one


def need(cfg: dict, key: str, where: str) -> int:
    """A required positive integer key."""
    if key not in cfg or cfg[key] is None:
        raise ModelError(f"{where}: config.json is missing required key '{key}'",
                         "pass a complete Hugging Face config.json")
    return positive(cfg, key, where)


def opt(cfg: dict, key: str, where: str, minimum: int = 1) -> int | None:
    """An optional integer key: absent or null → None; otherwise an integer ≥ ``minimum``."""
    if cfg.get(key) is None:
        return None
    return positive(cfg, key, where, minimum)


def positive(cfg: dict, key: str, where: str, minimum: int = 1) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= MAX_DIM:
        what = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise ModelError(f"{where}: config key '{key}' must be {what}, got {v!r}",
                         "fix config.json or download it again")
    return v


def first(cfg: dict, keys: tuple[str, ...], where: str, default: int | None = None) -> int:
    """The first present key of ``keys`` (architectures name the same fact differently)."""
    for k in keys:
        if cfg.get(k) is not None:
            return positive(cfg, k, where)
    if default is not None:
        return default
    raise ModelError(f"{where}: config.json is missing required key '{keys[0]}'",
                     "pass a complete Hugging Face config.json")


def layers(cfg: dict, key: str, where: str) -> int:
    n = need(cfg, key, where)
    if n > MAX_LAYERS:
        raise ModelError(f"{where}: {key} {n} is not a real layer count (at most {MAX_LAYERS})",
                         "fix config.json or download it again")
    return n
