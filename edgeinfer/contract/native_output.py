"""Native output contained: what libraries write while a plugin converts or loads a model (NNCF's progress
bars and bit-width tables, OpenVINO's, TVM's and the vendor toolkits' C/C++ prints) never reaches stdout,
which carries the command's answer (``--json``).

``@native_output()`` on a backend's ``convert`` / ``open`` / ``convert_decoder`` / ``open_decoder`` (or
``with native_output():``) points file descriptors 1 and 2, ``sys.stdout`` and the log handlers bound to it
at a temporary file while the call runs; ``sys.stderr`` still reaches the user, so edgeinfer's own progress
and warnings show. With ``edgeinfer --verbose`` nothing is hidden: fd 1 and ``sys.stdout`` go to stderr.
When the call fails with a library's exception (anything but an :class:`~edgeinfer.errors.EdgeInferError`,
or one raised from such an exception), the last lines captured are printed on stderr before the exception
goes on, so the library's own explanation is not lost; an EdgeInferError of the plugin's own says it all.

File descriptors belong to the process: while any thread is inside, every thread's native output is
contained. Blocks nest and overlap across threads: the first one in redirects, the last one out restores.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from edgeinfer.errors import EdgeInferError
from edgeinfer.progress import verbose

#: lines of captured output shown when a call fails
TAIL_LINES = 20

_LOCK = threading.Lock()
_active: list[_Capture] = []  # the one capture in force, if any


@contextlib.contextmanager
def native_output() -> Iterator[None]:
    """Contain fd 1/2 and ``sys.stdout`` while the block runs (see the module docstring); usable as a
    decorator: ``@native_output()``."""
    with _LOCK:
        capture = _join()
    if capture is None:
        yield
        return
    start = capture.size()
    tail = ""
    try:
        yield
    except Exception as e:
        if _from_a_library(e):
            tail = capture.tail(start)
        raise
    finally:
        with _LOCK:
            capture.users -= 1
            if capture.users == 0:
                _active.clear()
                capture.close()
        if tail:
            print(f"native output before the failure (last {TAIL_LINES} lines at most; `edgeinfer --verbose` "
                  f"shows all of it as it comes):\n{tail}", file=sys.stderr, flush=True)


def _join() -> _Capture | None:
    """The capture in force (set up when there is none), with one more user; None when fd 1/2 cannot be
    redirected (closed: ``edgeinfer … >&-``), so there is nothing to keep off them. Called under _LOCK."""
    if not _active:
        try:
            _active.append(_Capture(loud=verbose()))
        except OSError:
            return None
    _active[0].users += 1
    return _active[0]


def _from_a_library(e: Exception) -> bool:
    cause = e.__cause__
    return not isinstance(e, EdgeInferError) or (cause is not None and not isinstance(cause, EdgeInferError))


class _Follow:
    """``sys.stdout`` / ``sys.stderr`` during a capture: writes go to ``target``; after it, to whatever
    ``sys.<name>`` is then, so a handler a library created inside the block (bound to this object) keeps
    working."""

    def __init__(self, name: str, target: Any) -> None:
        self._name = name
        self.target = target

    def _current(self) -> Any:
        if self.target is not None:
            return self.target
        stream = getattr(sys, self._name)
        return getattr(sys, f"__{self._name}__") if stream is self else stream

    def write(self, data: str) -> int:
        return self._current().write(data)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self._current().flush()

    def isatty(self) -> bool:
        try:
            return bool(self._current().isatty())
        except Exception:
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)


class _Capture:
    """The redirection itself: set up by the first user, undone by the last."""

    def __init__(self, loud: bool) -> None:
        self.users = 0
        _flush_all()
        self.saved = (os.dup(1), os.dup(2))
        self.old = (sys.stdout, sys.stderr)
        self.file = None if loud else tempfile.TemporaryFile(prefix="edgeinfer-native-")
        self.own: list[Any] = []  # streams this capture opened
        if self.file is None:  # --verbose: stdout's share goes to stderr, in the open
            os.dup2(2, 1)
            out = _Follow("stdout", sys.stderr)
            err = None
        else:
            os.dup2(self.file.fileno(), 1)
            os.dup2(self.file.fileno(), 2)
            out = _Follow("stdout", self._text(os.dup(self.file.fileno())))
            err = _Follow("stderr", self._text(os.dup(self.saved[1]))) if _fileno(sys.stderr) == 2 else None
        self.follows = [f for f in (out, err) if f is not None]
        sys.stdout = out  # type: ignore[assignment]
        if err is not None:
            sys.stderr = err  # type: ignore[assignment]
        self.moved = _point_stdout_handlers(self.old[0], out)

    def _text(self, fd: int) -> io.TextIOWrapper:
        stream = io.TextIOWrapper(io.FileIO(fd, "w"), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
        self.own.append(stream)
        return stream

    def size(self) -> int:
        return 0 if self.file is None else os.fstat(self.file.fileno()).st_size

    def tail(self, start: int) -> str:
        """The last :data:`TAIL_LINES` lines written since ``start`` (bytes), each indented."""
        if self.file is None:
            return ""
        _flush_all()
        end = self.size()
        data = os.pread(self.file.fileno(), min(end - start, 64 * 1024), max(start, end - 64 * 1024))
        lines = [ln.rstrip() for ln in data.decode("utf-8", "replace").replace("\r", "\n").splitlines()]
        return "\n".join("  " + ln for ln in [ln for ln in lines if ln.strip()][-TAIL_LINES:])

    def close(self) -> None:
        _flush_all()
        for handler, stream in self.moved:
            handler.stream = stream
        if sys.stdout is self.follows[0]:
            sys.stdout = self.old[0]
        if len(self.follows) > 1 and sys.stderr is self.follows[1]:
            sys.stderr = self.old[1]
        for follow in self.follows:
            follow.target = None
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)
        for stream in self.own:
            with contextlib.suppress(Exception):
                stream.close()
        if self.file is not None:
            self.file.close()


def _point_stdout_handlers(stdout: Any, follow: _Follow) -> list[tuple[logging.StreamHandler, Any]]:
    """Log handlers that write to ``stdout`` (NNCF's, made at its import) write to ``follow`` for now; one bound
    to a stream closed since (a test's capture) keeps ``follow``, which outlives the block. Returns what to
    restore."""
    moved = []
    loggers = [logging.getLogger(), *(lg for lg in list(logging.Logger.manager.loggerDict.values())
                                      if isinstance(lg, logging.Logger))]
    for lg in loggers:
        for h in lg.handlers:
            if not isinstance(h, logging.StreamHandler) or isinstance(h, logging.FileHandler):
                continue
            if h.stream is stdout:
                moved.append((h, stdout))
            elif not getattr(h.stream, "closed", False):
                continue
            h.stream = follow  # not setStream: it flushes the old stream, which may be closed
    return moved


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except Exception:
        return None


def _flush_all() -> None:
    """Python's and C's buffered output, so it lands where it was written before the descriptors move."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        _libc().fflush(None)


@functools.cache
def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None)
