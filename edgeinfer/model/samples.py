"""The golden sample format of a bundle: ``golden/inputs.npz`` and ``golden/expected.npz`` hold a
list of feeds (or outputs) as entries ``<i>/<name>``; reading never unpickles."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeinfer.errors import InputError


def save_samples(path: Path, samples: list[dict[str, np.ndarray]]) -> None:
    np.savez(path, **{f"{i}/{k}": v for i, s in enumerate(samples) for k, v in s.items()})


def load_saved_samples(path: Path) -> list[dict[str, np.ndarray]]:
    """Samples saved by ``save_samples`` (keys ``<i>/<input>``); anything else is refused, never unpickled."""
    what = f"{path} is not a golden sample file written by edgeinfer"
    if not path.is_file():
        raise InputError(f"{path} is missing; deploy the model again", kind="bundle_damaged")
    out: dict[int, dict[str, np.ndarray]] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise InputError(f"{what} (a single array, not an .npz archive); deploy the model again",
                                 kind="bundle_damaged")
            for key in data.files:
                i, _, name = key.partition("/")
                if not i.isdigit() or not name:
                    raise InputError(f"{what} (unexpected entry {key!r}); deploy the model again",
                                     kind="bundle_damaged")
                arr = data[key]
                if arr.dtype.kind not in "biuf":
                    raise InputError(f"{what} (entry {key!r} has dtype {arr.dtype}); deploy the model again",
                                     kind="bundle_damaged")
                out.setdefault(int(i), {})[name] = arr
    except InputError:
        raise
    except Exception as e:  # zipfile / numpy format errors, object arrays refused by allow_pickle=False
        raise InputError(f"{what} ({type(e).__name__}: {str(e)[:80]}); deploy the model again",
                         kind="bundle_damaged") from None
    if not out:
        raise InputError(f"{what} (no samples); deploy the model again", kind="bundle_damaged")
    return [out[i] for i in sorted(out)]
