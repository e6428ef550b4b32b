"""What sealing costs on a 1 GB artifact: the size check every open does, and the full sha256 that
``golden``, ``serve`` start-up and ``edgeinfer verify`` do (see docs/deploy.md, "Sealed bundles").

    python bench/bundle_hashing.py [--size-mb 1024] [--repeat 3]

Builds a bundle in a temporary directory whose artifact is SIZE MB of random bytes, then times:
sealing it (``bundle.write`` hashes every file, as ``deploy`` does), ``Bundle.open`` with the size
check, and ``bundle.verify`` (every file hashed) once with the file evicted from the page cache
(``posix_fadvise(DONTNEED)``: "cold-ish", the disk or host cache may still help) and once warm.
The temporary directory, 1 GB file included, is deleted at the end. Writes bench/results/bundle_hashing.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write as write_result  # noqa: E402

from edgeinfer.contract.backend import TensorSpec  # noqa: E402
from edgeinfer.model.bundle import Bundle, Manifest, verify, write  # noqa: E402

CHUNK = 16 << 20


def make_artifact(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(CHUNK, left)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (no root needed for clean pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--opens", type=int, default=50)
    args = ap.parse_args()
    size = args.size_mb << 20
    with tempfile.TemporaryDirectory(prefix="edgeinfer-hash-bench-") as tmp:
        bundle = Path(tmp) / "bundle"
        bundle.mkdir()
        artifact = bundle / "model.bin"
        make_s = timed(lambda: make_artifact(artifact, size))
        manifest = Manifest(backend="onnxruntime", board="host", scheme="fp32", artifacts=["model.bin"],
                            inputs=[TensorSpec("x", (1, 16), "float32")], outputs=[TensorSpec("y", (1, 8),
                                                                                              "float32")],
                            source={"name": "random"})
        seal_s = timed(lambda: write(bundle, manifest))  # warm: the file was just written
        opens = [timed(lambda: Bundle.open(bundle)) for _ in range(args.opens)]
        cold, warm = [], []
        for _ in range(args.repeat):
            evict(artifact)
            cold.append(timed(lambda: verify(bundle)))
            warm.append(timed(lambda: verify(bundle)))
        assert verify(bundle)["ok"]
    gb = size / 1e9

    def summary(samples: list[float]) -> dict[str, float]:
        med = statistics.median(samples)
        return {"median_s": round(med, 4), "min_s": round(min(samples), 4), "max_s": round(max(samples), 4),
                "gb_per_s": round(gb / med, 3), "runs": len(samples)}

    result = {
        "artifact_bytes": size,
        "make_random_file_s": round(make_s, 2),
        "seal_at_write_s": round(seal_s, 3),
        "open_with_size_check_ms": {"median": round(statistics.median(opens) * 1e3, 3),
                                    "max": round(max(opens) * 1e3, 3), "runs": len(opens)},
        "verify_full_sha256_cold": summary(cold),
        "verify_full_sha256_warm": summary(warm),
        "notes": "cold = after posix_fadvise(DONTNEED) on the artifact (the host may still cache the disk); "
                 "sha256 via hashlib in 1 MiB reads (edgeinfer.contract.stamp.sha256_file); machine shared by others",
        "temporary_directory_removed": not Path(tmp).exists(),
    }
    write_result("bundle_hashing", result)
    print(result)


if __name__ == "__main__":
    main()
