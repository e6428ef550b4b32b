"""A smaller KV cache where the plan's runtime builds one: ``plan``'s ``suggestions.kv_cache``.

The KV cache grows with the context and the batch while the weights stay put, so at long contexts it is what
decides whether a decoder fits a 4-8 GB board. A runtime whose profile lists the KV dtypes it builds
(``runtimes.yaml`` ``kv_dtypes``: onnxruntime and llama.cpp keep q8_0, 1.0625 bytes a value against fp16's 2;
OpenVINO's CPU plugin u8, 1.1875 at head size 64) gets the plan again with the smallest of them, named when the
plan does not fit or when its KV cache is at least :data:`SHARE` of its memory, with that plan's decode estimate: a
smaller cache is not always a faster one (llama.cpp reads its q8_0 cache at 2.7 times fp16's time a position
here, ``runtimes.yaml`` ``kv_read_bytes``). The other price is the cache's rounding, which deploy's golden check
measures against the fp32 reference like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeinfer.planning.quant import kv_bytes_per_element, kv_dtypes

SHARE = 0.25  # the KV cache's share of a plan that fits above which the smaller cache is named anyway


def smaller_kv(p: Any, plan: Callable[..., Any], prof: dict) -> dict[str, Any] | None:
    """The suggestion for plan ``p`` (a ``planner.Plan``; ``plan`` is ``planner.plan``, ``prof`` its runtime's
    profile), or None."""
    kv = p.breakdown.get("kv_cache", 0)
    built = kv_dtypes(prof)
    if not kv or not built or p.details.paging is not None:
        return None

    def size(kv_dtype: str) -> float:  # OpenVINO's u8 keeps more beside a narrower head
        return kv_bytes_per_element(kv_dtype, p.model.head_dim)

    smallest = min(built, key=size)
    if size(smallest) >= size(p.kv_dtype) or (p.fits and kv < SHARE * p.total_bytes):
        return None
    alt = plan(p.model, p.board, quant=p.scheme.name, ctx=p.ctx, batch=p.batch, kv_dtype=smallest,
               runtime=p.runtime, suggest=False, prefill_chunk=p.prefill_chunk)
    return {"kv_dtype": smallest, "kv_cache_bytes": alt.breakdown["kv_cache"], "total_bytes": alt.total_bytes,
            "fits": alt.fits, "deploy_option": f"kv_dtype={smallest}",
            "decode_tokens_per_s": alt.estimates.decode_tokens_per_s}
