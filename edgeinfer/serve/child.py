"""A decoder worker started without multiprocessing's spawn: ``python -c`` with one end of a socket pair, or
(``serve --in-process``) a thread of the HTTP process with one end of a socket pair.

CPython's spawn start method (``popen_spawn_posix``) starts multiprocessing's resource tracker, a third
Python process (~12 MiB of RSS), before its first child, to hand each child the tracker's fd. A decoder
worker shares no multiprocessing semaphore or shared memory with the HTTP process (only the pipe), so it is
started here instead: the child reads the parent's ``sys.path``, then the pickled entry point and its
arguments, and runs it with the connection, as ``Process(target=fn, args=(conn, *args))`` would. The object
answers what :class:`~.supervisor.Supervisor` asks of a ``multiprocessing.Process``.

In a thread (:class:`ChildThread`) the worker speaks the same protocol over the same kind of pipe and saves
what a second interpreter holds: its own Python, edgeinfer, pydantic and tokenizer imports and the shared
libraries mapped again (bench/README.md, "One process"). What it gives up: a runtime that crashes takes the
server with it, and a worker cannot be killed — ``kill`` asks it to stop at its next step boundary, and a
thread still loading runs to the end of its load.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable

# the parent's sys.path first (standard library only until then), as spawn's preparation data gives it
ENTRY = ("import sys; from multiprocessing.connection import Connection; conn = Connection(int(sys.argv[1])); "
         "sys.path[:] = conn.recv(); from edgeinfer.serve.child import child_main; child_main(conn)")


class ChildProcess:
    def __init__(self, fn: Callable[..., None], args: tuple, name: str):
        ours, theirs = socket.socketpair()
        self.name = name
        with theirs:
            self._popen = subprocess.Popen([sys.executable, "-c", ENTRY, str(theirs.fileno())],
                                           pass_fds=(theirs.fileno(),))
        self.conn = Connection(ours.detach())
        self.conn.send(list(sys.path))
        self.conn.send((fn, args))

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()  # negative: killed by that signal, as multiprocessing reports it

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc malloc.h
MMAP_THRESHOLD = 1 << 20


def _mallopt(param: int, value: int) -> bool:
    try:
        return bool(ctypes.CDLL(None).mallopt(param, value))
    except (OSError, AttributeError):  # not glibc
        return False


def fixed_mmap_threshold() -> bool:
    """Give every allocation of MMAP_THRESHOLD bytes or more a mapping of its own, unmapped when freed
    (``mallopt(M_MMAP_THRESHOLD)``, https://man7.org/linux/man-pages/man3/mallopt.3.html); False where that
    is not glibc. Left to glibc the threshold rises to the size of each such block freed (up to 32 MiB), so a
    decoder's step buffers move into the heap, which keeps the high-water mark of every batch shape seen: a
    served w8a8 decoder worker peaked at 404 MiB, 369 with this (bench/README.md, "malloc")."""
    return _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def one_malloc_arena() -> bool:
    """Make every thread created from now on allocate from glibc's main arena (``mallopt(M_ARENA_MAX, 1)``,
    https://man7.org/linux/man-pages/man3/mallopt.3.html); False where that is not glibc. A decoder loaded
    on a thread of its own arena kept what loading freed: a served w8a8 decoder peaked at 473 MiB on its
    thread, 407–413 with one arena, 453–469 as a worker process (bench/README.md, "One process")."""
    return _mallopt(M_ARENA_MAX, 1)


def return_freed_heap() -> bool:
    """Give the kernel back the free pages of glibc's heap (``malloc_trim(0)``,
    https://man7.org/linux/man-pages/man3/malloc_trim.3.html); False where that is not glibc. Parsing a
    tokenizer.json frees far more than it keeps (a Qwen vocabulary's: ~125 MiB at the peak, ~45 kept) and the
    heap keeps the rest resident until trimmed: serve's HTTP process calls it once its models are open."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):  # not glibc
        return False


class ChildThread:
    """``fn(conn, *args)`` on a thread of this process, behind the same questions as :class:`ChildProcess`:
    its pid is this process's; its exit code 0 when ``fn`` returned, 1 when it raised (logged). Threads
    started from then on share glibc's main malloc arena (:func:`one_malloc_arena`)."""

    def __init__(self, fn: Callable[..., None], args: tuple, name: str):
        one_malloc_arena()
        fixed_mmap_threshold()
        ours, theirs = socket.socketpair()
        self.name = name
        self.conn = Connection(ours.detach())
        self._theirs = Connection(theirs.detach())
        self.exitcode: int | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., None], args: tuple) -> None:
        code = 1
        try:
            fn(self._theirs, *args)
            code = 0
        except BaseException:  # noqa: BLE001 - as a process's uncaught exception: logged, exit code 1
            logging.getLogger("edgeinfer.serve").exception("%s ended with an exception", self.name)
        finally:
            self.exitcode = code
            self._theirs.close()  # the parent's reader sees the end of the pipe: the worker exited

    @property
    def pid(self) -> int:
        return os.getpid()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def kill(self) -> None:
        """A thread cannot be killed: ask it to stop after its current step (a loading one ignores it)."""
        try:
            self.conn.send(("stop",))
        except (OSError, ValueError):
            pass


def child_main(conn: Connection) -> None:
    fixed_mmap_threshold()
    fn, args = conn.recv()
    fn(conn, *args)


def start(fn: Callable[..., None], args: tuple, name: str, in_process: bool = False) -> tuple[Any, Any]:
    """The started process (or thread, ``in_process``) and the parent's end of its connection."""
    proc = ChildThread(fn, args, name) if in_process else ChildProcess(fn, args, name)
    return proc, proc.conn
