"""Calibration (and golden) samples from what a user has on disk.

Accepted: a ``.npz`` (one array per input, samples along the first axis), a
directory of ``.npz`` files (one sample each) or of ``.npy`` files (single-input
models), or a text file with one sample per line, tokenized with the model's own
tokenizer; for a reranker (a cross-encoder) a line ``query<TAB>document`` is a text pair.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract.backend import TensorSpec, validate_feeds
from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import FeedError, InputError

DEFAULT_SAMPLES = 128  # enough for MinMax-style PTQ on the models we target
FEW_SAMPLES = 32  # below this, ranges are noisy: warn

Feeds = dict[str, np.ndarray]


def load_samples(
    path: Path, specs: Sequence[TensorSpec], tokenize: Callable[[list[str]], Feeds] | None = None,
    pairs: bool = False,
) -> list[Feeds]:
    """Every sample in ``path``, each shaped as one call of a model with ``specs``; errors name the sample.
    ``pairs`` (rerankers): a text line ``query<TAB>document`` is one text pair."""
    if not path.exists():
        raise InputError(f"calibration data not found: {path}")
    if path.is_dir():
        samples = _from_dir(path, specs)
    elif path.suffix == ".npz":
        samples = _split_npz(path, specs)
    elif path.suffix in (".txt", ".text", ".jsonl") or _looks_like_text(path):
        if tokenize is None:
            raise InputError(
                f"{path} is text, but the model has no tokenizer here: deploy from the Hugging Face directory, "
                "or pass tensors as .npz"
            )
        lines = [_pair(ln.strip()) if pairs else ln.strip()
                 for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        if not lines:
            raise InputError(f"{path} has no text lines")
        batch = _static_batch(specs)
        samples = [tokenize(lines[i : i + batch]) for i in range(0, len(lines), batch)]
        samples = [s for s in samples if len(next(iter(s.values()))) == batch]
        names = [f"{path.name} lines {i * batch + 1}-{(i + 1) * batch}" for i in range(len(samples))]
        return _checked(samples, names, specs)
    else:
        raise InputError(f"unsupported calibration data {path}: use a .npz, a directory of .npz/.npy, or a .txt")
    return samples


def _pair(line: str) -> str | tuple[str, str]:
    """A line ``query<TAB>document`` is a text pair (a reranker's input); any other line is one text."""
    first, tab, second = line.partition("\t")
    return (first.strip(), second.strip()) if tab else line


def _static_batch(specs: Sequence[TensorSpec]) -> int:
    first = specs[0].shape[0] if specs and specs[0].shape else None
    return first if isinstance(first, int) and first > 0 else 1


def _looks_like_text(path: Path) -> bool:
    head = path.read_bytes()[:512]
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in head


def _split_npz(path: Path, specs: Sequence[TensorSpec]) -> list[Feeds]:
    data = _load_arrays(path, archive=True)
    batch = _static_batch(specs)
    lengths = {k: len(v) for k, v in data.items()}
    if len(set(lengths.values())) > 1:
        raise InputError(f"{path}: arrays disagree on the number of samples: {lengths}")
    n = next(iter(lengths.values()), 0)
    full = n - n % batch  # a trailing partial batch cannot be fed to a static-batch model
    samples = [{k: v[i : i + batch] for k, v in data.items()} for i in range(0, full, batch)]
    return _checked(samples, [f"{path.name}[{i * batch}]" for i in range(len(samples))], specs)


def _from_dir(path: Path, specs: Sequence[TensorSpec]) -> list[Feeds]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy"))
    if not files:
        raise InputError(f"{path} holds no .npz or .npy samples")
    samples, names = [], []
    for f in files:
        if f.suffix == ".npz":
            samples.append(_load_arrays(f, archive=True))
        else:
            if len(specs) != 1:
                raise InputError(f"{f.name}: .npy samples only work for single-input models; use .npz with input "
                                 "names")
            samples.append({specs[0].name: _load_arrays(f, archive=False)})
        names.append(f.name)
    return _checked(samples, names, specs)


def _load_arrays(path: Path, archive: bool) -> Any:
    """The arrays of a .npz (``archive``: a dict) or the array of a .npy; object arrays are refused,
    never unpickled."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            arrays: Any = loaded
        else:
            with loaded:
                arrays = {k: loaded[k] for k in loaded.files}
    except Exception as e:
        raise InputError(f"{path} is not a readable {path.suffix or 'NumPy'} file ({first_line(e, 160)})") from None
    if archive != isinstance(arrays, dict):
        kind = ".npz archive of named arrays" if archive else ".npy array"
        raise InputError(f"{path} is not a {kind}")
    return arrays


def _checked(samples: list[Feeds], names: list[str], specs: Sequence[TensorSpec]) -> list[Feeds]:
    out = []
    for name, sample in zip(names, samples):
        try:
            out.append(validate_feeds(specs, sample))
        except FeedError as e:
            raise FeedError(f"calibration sample {name}: {e.message}") from None
    return out


def split(samples: list[Feeds], limit: int = DEFAULT_SAMPLES, heldout: int = 16) -> tuple[list[Feeds], list[Feeds]]:
    """(calibration, held-out): the held-out tail is never used for calibration when there is enough data."""
    if len(samples) >= 2 * heldout:
        return samples[:-heldout][:limit], samples[-heldout:]
    return samples[:limit], []


def fallback_samples(specs: list[TensorSpec], tokenize, n: int) -> list[Feeds]:
    """Golden samples when the user gave none: packaged sentences for text models, seeded noise otherwise."""
    if tokenize is not None:
        lines = (Path(__file__).parents[1] / "data" / "golden_sentences.txt").read_text().splitlines()
        batch = _static_batch(specs)
        lines = [ln for ln in lines if ln.strip()][: n * batch]
        return [tokenize(lines[i : i + batch]) for i in range(0, len(lines) - len(lines) % batch, batch)]
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(n):
        feeds = {}
        for s in specs:
            shape = [d if isinstance(d, int) else 1 for d in s.shape]
            if np.dtype(s.dtype).kind in "iu":
                feeds[s.name] = rng.integers(0, 2, size=shape).astype(s.dtype)
            else:
                feeds[s.name] = rng.standard_normal(shape).astype(s.dtype)
        samples.append(feeds)
    return samples


def fingerprint(samples: list[Feeds]) -> str:
    h = hashlib.sha256()
    for s in samples:
        for k in sorted(s):
            h.update(k.encode())
            h.update(np.ascontiguousarray(s[k]).tobytes())
    return h.hexdigest()
