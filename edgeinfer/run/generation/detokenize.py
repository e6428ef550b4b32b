"""Streaming detokenization: token ids in, text pieces out, never a piece that a later token would change."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgeinfer.run.generation.text import TextCodec


class Detokenizer:
    """Turns a growing list of token ids into text pieces.

    Decodes a short window of recent ids and emits only what is new, holding text back while it ends in
    U+FFFD (an incomplete UTF-8 sequence): the prefix/read offsets of Hugging Face
    text-generation-inference's ``decode_token`` (https://github.com/huggingface/text-generation-inference).
    Unlike there, a U+FFFD that no later byte can turn into a character (bytes that are not UTF-8, from a
    random or confused model) is released at once instead of holding the stream back until a valid character
    follows: the held tokens' bytes (``codec.token_text``) must end inside a character — a lead byte with fewer
    continuation bytes than it announces, at most 3 bytes — for the text to wait. A served random model's
    stream of such bytes reached its first text 14.3 s after it was sent, at 16 streams where the other 15 had
    theirs within 4.4 s (bench/README.md).
    """

    def __init__(self, codec: TextCodec):
        self.codec = codec
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        prefix = self.codec.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.codec.decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not (text.endswith("\ufffd") and self._may_complete()):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """What is still held back when the sequence ends."""
        prefix = self.codec.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.codec.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :]

    def _may_complete(self) -> bool:
        """Whether the bytes of the tokens held back end inside a UTF-8 character."""
        held = self.ids[self.read_offset :]
        return ends_inside_a_character(b"".join(self.codec.token_text(i)[1] for i in held))


def ends_inside_a_character(data: bytes) -> bool:
    """Whether ``data`` ends with the start of a UTF-8 character that more bytes could complete: a lead byte
    (C2–F4) followed by fewer continuation bytes (80–BF) than it announces (RFC 3629, section 4)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if 0x80 <= b <= 0xBF:  # a continuation byte: its lead is further back
            continue
        need = 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
        return back < need
    return False
