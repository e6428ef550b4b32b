"""A GGUF's own vocabulary through llama.cpp (llama-cpp-python's low-level bindings): the tokenizer of a ``.gguf``
with no tokenizer.json next to it. The model is loaded with ``vocab_only`` (no weights); ``llama_tokenize``,
``llama_detokenize`` and ``llama_token_to_piece`` are llama.cpp's own (include/llama.h), the chat template is the
file's ``tokenizer.chat_template`` (``llama_model_chat_template``)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

from edgeinfer.contract import Vocabulary
from edgeinfer.errors import ModelError

from .decoder import clear_errors, init_backend, llama_error


class GgufVocabulary(Vocabulary):
    def __init__(self, gguf: Path):
        ll = self._ll = init_backend()
        params = ll.llama_model_default_params()
        params.vocab_only = True
        clear_errors()
        self._model = ll.llama_model_load_from_file(str(gguf).encode(), params)
        if not self._model:
            raise ModelError(f"llama.cpp cannot read the vocabulary of {gguf.name}{llama_error()}: re-download or "
                             "convert the model again")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.vocab_size = int(ll.llama_vocab_n_tokens(self._vocab))
        # llama.cpp's end-of-generation set (EOS, EOT and the other tokens its vocabulary code marks as ending
        # one: <|endoftext|>, <|im_end|> ..., src/llama-vocab.cpp), as llama-server stops on
        self.eos_token_ids = tuple(t for t in range(self.vocab_size) if ll.llama_vocab_is_eog(self._vocab, t))
        template = ll.llama_model_chat_template(self._model, None)
        self.chat_template = template.decode("utf-8", "replace") if template else None
        self.special_tokens = {}
        v = self._vocab
        for key, tok in (("bos_token", ll.llama_vocab_bos(v)), ("eos_token", ll.llama_vocab_eos(v))):
            if 0 <= tok < self.vocab_size:
                self.special_tokens[key] = self.token_bytes(tok).decode("utf-8", "replace")

    def encode(self, text: str, add_special: bool) -> list[int]:
        raw = text.encode("utf-8")
        room = len(raw) + 8
        for _ in range(2):  # a negative count is the room it needs
            out = (self._ll.llama_token * room)()
            n = self._ll.llama_tokenize(self._vocab, raw, len(raw), out, room, add_special, True)
            if n >= 0:
                return [int(t) for t in out[:n]]
            room = -n
        raise ModelError(f"llama_tokenize could not tokenize {len(raw)} bytes")

    def decode(self, ids: Sequence[int]) -> str:
        tokens = (self._ll.llama_token * max(1, len(ids)))(*ids)
        room = 8 * len(ids) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(room)
            n = self._ll.llama_detokenize(self._vocab, tokens, len(ids), buf, room, False, False)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            room = -n
        raise ModelError(f"llama_detokenize could not detokenize {len(ids)} tokens")

    def token_bytes(self, token_id: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._ll.llama_token_to_piece(self._vocab, int(token_id), buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._ll.llama_token_to_piece(self._vocab, int(token_id), buf, len(buf), 0, True)
        return buf.raw[:max(n, 0)]

    def close(self) -> None:
        if self._model:
            self._ll.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()
