"""stdout that survives a reader that went away: ``edgeinfer plan … | head -1``.

Once the pipe breaks, the rest of the output is dropped and the command finishes as it would have,
so the exit code is the command's own (0 fits, 1 does not fit) — no traceback, no "Broken pipe".
"""

from __future__ import annotations

import os
from typing import Any, TextIO


class PipeSafeStdout:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, data: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(data)
            except BrokenPipeError:
                self._reader_gone()
        return len(data)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        """Point the descriptor at /dev/null, so buffered bytes and the interpreter's last flush go nowhere."""
        self._gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
