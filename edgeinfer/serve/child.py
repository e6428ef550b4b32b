"""A worker process started without multiprocessing's spawn: ``python -c`` with one end of a socket pair.

CPython's spawn start method (``popen_spawn_posix``) starts multiprocessing's resource tracker, a third
Python process (~12 MiB of RSS), before its first child, to hand each child the tracker's fd. A decoder
worker shares no multiprocessing semaphore or shared memory with the HTTP process (only the pipe), so it is
started here instead: the child reads the parent's ``sys.path``, then the pickled entry point and its
arguments, and runs it with the connection, as ``Process(target=fn, args=(conn, *args))`` would. The object
answers what :class:`~.supervisor.Supervisor` asks of a ``multiprocessing.Process``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
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


def child_main(conn: Connection) -> None:
    fn, args = conn.recv()
    fn(conn, *args)


def start(fn: Callable[..., None], args: tuple, name: str) -> tuple[Any, Any]:
    """The started process and the parent's end of its connection."""
    proc = ChildProcess(fn, args, name)
    return proc, proc.conn
