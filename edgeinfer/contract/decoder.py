"""The decoder contract: what a backend gives the core to generate text.

``open_decoder`` returns one of two kinds of :class:`Decoder`:

- a :class:`StepDecoder` gives the **step primitives** (``prefill``, ``decode``, ``reset``) against a KV
  cache it owns, sized once at load for ``context`` positions × ``slots`` sequences; the core runs the loop;
- a :class:`NativeDecoder` runs the **runtime's own loop** (``generate_native``: OpenVINO GenAI pipelines,
  RKLLM), driven with the same options and reporting the same metrics. One that batches continuously is a
  :class:`BatchingDecoder`: it also takes requests one at a time between its steps (``add_request`` /
  ``step_requests`` / ``cancel_request``), which is how ``edgeinfer serve`` drives it.

The core tells them apart with ``isinstance``. ``edgeinfer.testing.decoder_conformance`` checks both.
Token ids cross the boundary as ``int64`` NumPy arrays, logits as ``float32``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

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
    """One decoder model loaded on one device, with its KV cache allocated: the facts the loop and the
    metrics read. A backend returns a :class:`StepDecoder` or a :class:`NativeDecoder`, never this class."""

    backend_name: str = ""
    # one line a user needs next to this decoder's speed, said once by generate / chat (stderr), bench (notes)
    # and serve (log, /ready): e.g. a backend running on a fallback device ("for checking, not for speed")
    caveat: str = ""
    # the KV cache's element type as plans and manifests name it ("fp32", "fp16", "q8_0"); "" not said
    kv_dtype: str = ""
    # the CPU threads the runtime computes with, where the backend sets them (asked for, or its own default);
    # None: left to the runtime. bench reports it next to the speed
    threads: int | None = None

    def __init__(self, *, context: int, vocab_size: int, kv_cache_bytes: int, slots: int = 1,
                 prefill_chunk: int | None = None, device: str = ""):
        self.context = context  # positions per sequence: prompt + generated tokens
        self.vocab_size = vocab_size
        self.kv_cache_bytes = kv_cache_bytes  # allocated once at load, for all slots
        self.slots = slots  # sequences that can decode at once
        self.prefill_chunk = prefill_chunk  # most tokens one prefill call takes; None: any
        self.device = device
        self._closed = False

    # --- optional --------------------------------------------------------------------------
    def op_times(self, phase: str, token_ids: np.ndarray) -> list[OpTime]:
        """Per-op times of one ``phase`` ("prefill" or "decode") call, slowest first; [] if unknown."""
        return []

    def paging_stats(self) -> dict[str, Any] | None:
        """A layer-paged decoder's counters since load, None when it does not page: ``segments``,
        ``window``, ``prefetch``, ``page_ins``, ``page_in_ms_mean`` (per segment), ``segment_bytes`` and
        ``peak_resident_bytes`` (weight bytes resident at once); ``bench`` reports them (docs/paging.md)."""
        return None

    def release(self) -> None:
        """Free the runtime's resources (the KV cache included)."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.release()

    @property
    def closed(self) -> bool:
        return self._closed


class StepDecoder(Decoder, ABC):
    """A decoder the core steps: it owns the KV cache, the core owns the loop (sampling, stopping)."""

    @abstractmethod
    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        """Append ``token_ids`` (1-D) to ``slot``'s cache; return the last position's logits (vocab,)."""

    @abstractmethod
    def decode(self, slots: Sequence[int], token_ids: np.ndarray) -> np.ndarray:
        """Append one token per slot (``token_ids[i]`` to ``slots[i]``); return logits (len(slots), vocab)."""

    @abstractmethod
    def reset(self, slot: int) -> None:
        """Forget ``slot``'s sequence; its cache positions are reused from 0."""

    # --- optional --------------------------------------------------------------------------
    def prefill_batch(self, slots: Sequence[int], token_ids: Sequence[np.ndarray]) -> np.ndarray:
        """Append ``token_ids[i]`` (1-D, lengths may differ) to ``slots[i]``'s cache, for distinct slots;
        return each row's last-position logits (len(slots), vocab). The serve scheduler calls it with the
        prompt chunks of every sequence it prefills in one step. Default: one ``prefill`` per slot; a
        backend that can run the rows in one runtime call overrides it."""
        import numpy as np

        return np.stack([np.asarray(self.prefill(s, ids), dtype=np.float32) for s, ids in zip(slots, token_ids)])


class NativeDecoder(Decoder, ABC):
    """A decoder whose runtime runs the whole generation loop itself."""

    @abstractmethod
    def generate_native(
        self, prompt_ids: Sequence[int], options: GenerationOptions, on_token: Callable[[int], bool]
    ) -> dict[str, Any]:
        """Generate from ``prompt_ids``, calling ``on_token(id)`` per new token (False: stop now).
        Return the runtime's own metrics in edgeinfer's names (``ttft_ms``, ``tpot_ms`` ...)."""


class BatchingDecoder(NativeDecoder):
    """A native loop that batches continuously: it takes and drops requests at its step boundaries.
    Without it, ``edgeinfer serve`` runs ``generate_native`` one request at a time."""

    @abstractmethod
    def add_request(self, rid: str, prompt_ids: Sequence[int], options: GenerationOptions) -> None:
        """Queue a generation; it joins the running batch at the runtime's next step."""

    @abstractmethod
    def step_requests(self) -> list[NativeStep]:
        """Run one step of every running request; report each request that moved or ended."""

    @abstractmethod
    def cancel_request(self, rid: str) -> None:
        """End ``rid`` now and free its KV cache; it is reported no more."""


class Vocabulary(ABC):
    """A tokenizer a backend reads from a decoder file that has none next to it (a ``.gguf`` holds its own
    vocabulary and chat template): what the core's text codec needs besides a Hugging Face tokenizer.json.
    Returned by ``Backend.open_vocabulary``."""

    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()  # the ids that end an answer
    chat_template: str | None = None  # Jinja, as Hugging Face writes it (rendered by the core, sandboxed)
    special_tokens: dict[str, str] = {}  # noqa: RUF012 - bos_token / eos_token ... as text, for the template

    @abstractmethod
    def encode(self, text: str, add_special: bool) -> list[int]:
        """Token ids of ``text``; special tokens written in it are parsed as such; ``add_special``: also the
        ones the vocabulary adds on its own (a BOS)."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special (control) tokens left out."""

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for (special tokens spelled out)."""

    def close(self) -> None:  # noqa: B027 - optional
        """Free what the vocabulary holds."""
