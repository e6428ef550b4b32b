"""The decoder contract: what a backend gives the core to generate text.

A backend implements either the **step primitives** (``prefill``, ``decode``,
``reset``) against a KV cache it owns, sized once at load for ``context``
positions × ``slots`` sequences, and the core runs the loop; or a **native loop**
(``native_loop = True`` and ``generate_native``), driven with the same options and
reporting the same metrics. ``edgeinfer.testing.decoder_conformance`` checks both. A native loop
that batches continuously (``native_steps``) also takes requests one at a time between its steps
(``add_request`` / ``step_requests`` / ``cancel_request``), which is how ``edgeinfer serve`` drives it.

Token ids cross the boundary as ``int64`` NumPy arrays, logits as ``float32``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

if TYPE_CHECKING:
    import numpy as np

    from edgeinfer.contract.backend import OpTime
    from edgeinfer.contract.generation import GenerationOptions


class NativeStep(NamedTuple):
    """What one step of a continuously batching native loop did for one request."""

    rid: str
    token_ids: list[int]  # generated since the last step (an EOS that ended it included, where reported)
    finished: bool = False  # the runtime ended it (EOS, max_new_tokens, an error)
    error: str | None = None  # why the runtime could not run it


class Decoder:
    """One decoder model loaded on one device, with its KV cache allocated."""

    #: True when the backend runs the whole loop itself (``generate_native``)
    native_loop: ClassVar[bool] = False

    backend_name: str = ""

    def __init__(self, *, context: int, vocab_size: int, kv_cache_bytes: int, slots: int = 1,
                 prefill_chunk: int | None = None, device: str = ""):
        self.context = context  # positions per sequence: prompt + generated tokens
        self.vocab_size = vocab_size
        self.kv_cache_bytes = kv_cache_bytes  # allocated once at load, for all slots
        self.slots = slots  # sequences that can decode at once
        self.prefill_chunk = prefill_chunk  # most tokens one prefill call takes; None: any
        self.device = device
        self._closed = False

    # --- step primitives ---------------------------------------------------------------------
    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        """Append ``token_ids`` (1-D) to ``slot``'s cache; return the last position's logits (vocab,)."""
        raise NotImplementedError

    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        """Append one token per slot (``token_ids[i]`` to ``slots[i]``); return logits (len(slots), vocab)."""
        raise NotImplementedError

    def reset(self, slot: int) -> None:
        """Forget ``slot``'s sequence; its cache positions are reused from 0."""
        raise NotImplementedError

    # --- native loop -------------------------------------------------------------------------
    def generate_native(
        self, prompt_ids: Sequence[int], options: GenerationOptions, on_token: Callable[[int], bool]
    ) -> dict[str, Any]:
        """Generate from ``prompt_ids``, calling ``on_token(id)`` per new token (False: stop now).
        Return the runtime's own metrics in edgeinfer's names (``ttft_ms``, ``tpot_ms`` ...)."""
        raise NotImplementedError

    def generate_native_batch(
        self, requests: Sequence[tuple[Sequence[int], GenerationOptions]], on_token: Callable[[int, int], bool]
    ) -> list[dict[str, Any]]:
        """Optional, for native-loop backends loaded with ``slots > 1``: generate for all
        ``requests`` (prompt ids, options) at once, calling ``on_token(i, id)`` per new token of
        request ``i`` (False: stop request ``i`` only). Return one metrics dict per request, as
        :meth:`generate_native` does."""
        raise NotImplementedError

    # --- native loop, request by request (optional) --------------------------------------------
    @property
    def native_steps(self) -> bool:
        """True when the native loop takes and drops requests at its step boundaries (continuous
        batching): ``add_request`` / ``step_requests`` / ``cancel_request`` below."""
        return False

    def add_request(self, rid: str, prompt_ids: Sequence[int], options: GenerationOptions) -> None:
        """Queue a generation; it joins the running batch at the runtime's next step."""
        raise NotImplementedError

    def step_requests(self) -> list[NativeStep]:
        """Run one step of every running request; report each request that moved or ended."""
        raise NotImplementedError

    def cancel_request(self, rid: str) -> None:
        """End ``rid`` now and free its KV cache; it is reported no more."""
        raise NotImplementedError

    # --- optional --------------------------------------------------------------------------
    def op_times(self, phase: str, token_ids: np.ndarray) -> list[OpTime]:
        """Per-op times of one ``phase`` ("prefill" or "decode") call, slowest first; [] if unknown."""
        return []

    def release(self) -> None:
        """Free the runtime's resources (the KV cache included)."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.release()

    @property
    def closed(self) -> bool:
        return self._closed
