"""``edgeinfer.load``: pick the backend for a file, convert it when it is not native, cache the result.

A cache entry is sealed (:mod:`edgeinfer.run.seal`) once the conversion is complete and hashed again
before each reuse: a damaged or half-written entry is converted again, never loaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from edgeinfer.build import cache
from edgeinfer.contract import registry as plugins
from edgeinfer.contract import stamp
from edgeinfer.contract.backend import Backend, Session
from edgeinfer.contract.names import ENCODER_REFERENCE
from edgeinfer.errors import InputError

# keys of **options that change the converted artifact (the rest only affect load)
CONVERT_OPTIONS = ("scheme", "shapes", "target")


def choose_backend(path: Path, name: str | None) -> Backend:
    if name:
        return plugins.get_backend(name)
    stamped = stamp.read(path) if path.exists() else None
    if stamped:
        return plugins.get_backend(stamped["backend"])
    candidates = [n for n in plugins.backend_names() if plugins.get_backend(n).is_native(path)]
    if ENCODER_REFERENCE in candidates:  # the reference backend wins for plain ONNX
        return plugins.get_backend(ENCODER_REFERENCE)
    if candidates:
        return plugins.get_backend(candidates[0])
    raise InputError(
        f"no installed backend loads {path.suffix or 'this kind of'} files natively; pass --backend "
        f"(installed: {', '.join(plugins.backend_names()) or 'none'})"
    )


def converted(backend: Backend, path: Path, options: dict[str, Any]) -> Path:
    """The cached native artifact for ``path`` on ``backend``, converting it on first use."""
    convert_opts = {k: options.pop(k) for k in CONVERT_OPTIONS if k in options}
    scheme = convert_opts.pop("scheme", None) or backend.default_scheme
    key = cache.key({"sha256": stamp.sha256_file(path), "backend": backend.name, "versions": backend.versions(),
                     "scheme": scheme, "options": convert_opts})
    entry = cache.area("artifacts") / backend.name / key
    out = entry / (path.stem + backend.native_suffixes[0])
    if cache.intact(entry) and out.is_file():
        return out
    shutil.rmtree(entry, ignore_errors=True)  # damaged, unsealed or half-written: convert again
    try:
        made = backend.quantize(path, scheme, None, out, **convert_opts)
        cache.seal_entry(entry)  # verified before every reuse
    except BaseException:
        shutil.rmtree(entry, ignore_errors=True)  # a failed conversion leaves no entry behind
        raise
    return made


def load(path: Any, backend: str | None = None, device: str | None = None, **options: Any) -> Session:
    from edgeinfer.run.bundle import Bundle, is_bundle

    p = Path(path)
    if not p.exists():
        raise InputError(f"model file not found: {p}")
    if is_bundle(p):
        bundle = Bundle.open(p)
        if backend and backend != bundle.manifest.backend:
            raise InputError(f"bundle {p} is for backend {bundle.manifest.backend!r}, not {backend!r}; "
                             "omit --backend")
        return bundle.load(device=device, **options)
    be = choose_backend(p, backend)
    if not be.is_native(p):
        p = converted(be, p, options)
    elif "shapes" in options:
        raise InputError(f"shapes apply when a model is converted; {p.name} is already native to {be.name}")
    return be.load(p, device=device, **options)
