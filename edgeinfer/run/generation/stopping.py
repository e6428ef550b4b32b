"""When an answer ends, for every loop (``Generator``'s, serve's schedulers, a backend's own): EOS ids,
stop strings, ``max_new_tokens``, and the context a prompt leaves for new tokens.

Stop strings on a text stream: the text ends before the first stop string, and text that could still
become one is held back until it cannot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgeinfer.errors import InputError

if TYPE_CHECKING:
    from edgeinfer.contract.generation import GenerationOptions
    from edgeinfer.run.generation.text import TextCodec


def eos_ids(options: GenerationOptions, model_eos: Sequence[int]) -> frozenset[int]:
    """The token ids that end an answer: the request's, else the model's (none with ``ignore_eos``)."""
    if options.ignore_eos:
        return frozenset()
    return frozenset(options.eos_token_ids if options.eos_token_ids is not None else model_eos)


def length_reached(generated: int, options: GenerationOptions) -> bool:
    """The ``max_new_tokens`` stop: ``generated`` new tokens are all the request allows."""
    return generated >= options.max_new_tokens


class ContextExceeded(InputError):
    """A prompt that leaves no room in the context, or less than the new tokens asked for."""

    def __init__(self, prompt: int, context: int, wanted: int | None, room: int):
        self.prompt, self.context, self.wanted, self.room = prompt, context, wanted, room
        fix = f"lower max_new_tokens to {room}" if room > 0 else "shorten the prompt"
        asked = wanted if wanted is not None else "at least 1"
        super().__init__(f"prompt ({prompt} tokens) + max_new_tokens ({asked}) exceed "
                         f"the context of {context} tokens this model was loaded for; {fix}, or load/deploy with a "
                         "larger --ctx")


def context_room(prompt: int, context: int, wanted: int | None = None) -> int:
    """The new tokens a ``prompt``-token prompt may generate in ``context`` positions: ``wanted``, or all the
    room left when None. ContextExceeded when there is no room, or less than ``wanted``."""
    room = context - prompt
    if room < 1 or (wanted is not None and wanted > room):
        raise ContextExceeded(prompt, context, wanted, room)
    return wanted if wanted is not None else room


class StopStrings:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Text that is safe to emit now (empty once a stop string was seen)."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        text = self.held + piece
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.held = True, ""
            return text[:cut]
        keep = self._partial_suffix(text)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


class Answer:
    """The new tokens of one generation, whichever loop made them: EOS, text pieces held back until
    they cannot start a stop string, the ``max_new_tokens`` stop, the finish reason."""

    def __init__(self, codec: TextCodec, options: GenerationOptions):
        self.options = options
        self.eos = eos_ids(options, codec.eos_token_ids)
        self.detok, self.stops = codec.stream(), StopStrings(options.stop)
        self.ids: list[int] = []
        self.text: list[str] = []
        self.finish = "length"

    @property
    def stopped(self) -> bool:
        """EOS or a stop string ended the answer."""
        return self.finish == "stop"

    @property
    def done(self) -> bool:
        """EOS, a stop string or ``max_new_tokens`` ended the answer: take no more tokens."""
        return self.stopped or length_reached(len(self.ids), self.options)

    def push(self, tok: int) -> str:
        """Take one new token; return the text it releases ("" while held back, at EOS, after a stop string)."""
        self.ids.append(tok)
        if tok in self.eos:
            self.finish = "stop"
            return ""
        piece = self.stops.feed(self.detok.push(tok))
        if self.stops.stopped:
            self.finish = "stop"
        return self._keep(piece)

    def end(self, cancelled: bool) -> str:
        """The text still held back (none after a stop string or a cancel)."""
        if cancelled:
            self.finish = "cancelled"
            return ""
        if self.stops.stopped:
            return ""
        return self._keep(self.stops.feed(self.detok.flush()) + self.stops.flush())

    def _keep(self, piece: str) -> str:
        if piece:
            self.text.append(piece)
        return piece
