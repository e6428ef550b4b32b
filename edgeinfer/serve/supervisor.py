"""One worker process, supervised: the part that the encoder pool's workers (:mod:`.workers`) and a served
decoder's engine (:mod:`.decoder_engine`) share.

The process is started with the spawn start method (no inherited runtime state) and talks over a
``multiprocessing`` pipe. A reader thread per process hands each message to the event loop (or the loop
reads the pipe itself: ``read_in_loop``); messages of a process that was replaced are dropped. The worker
says ``("ready", info)`` once it has loaded, or ``("fatal", message)``. When it exits, the outcome is one of:

- ``"stopped"``: the main process stopped it;
- ``"failed"``: it never became ready (the models cannot be loaded: starting fails, no restart);
- ``"restarting"``: it crashed (or was killed, see :meth:`Supervisor.kill`) after it had been ready, and is
  started again;
- ``"gave up"``: it crashed more than ``max_restarts`` times within ``restart_window_s``.

Workers ignore SIGTERM and SIGINT: the main process decides when they stop (:meth:`Supervisor.stop`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing as mp
import threading
import time
from typing import Any, Callable

log = logging.getLogger("edgeinfer.serve")

STOP_GRACE_S = 10.0  # how long a worker told to stop may take before it is killed (docs/serve.md, Shutdown)


def stop_process(process: Any, grace: float) -> None:
    """Wait up to ``grace`` s for ``process`` to exit, then SIGKILL it: workers ignore SIGTERM (the main
    process decides when they stop), so ``terminate()`` would not end one."""
    if process is None:
        return
    process.join(max(0.0, grace))
    if process.is_alive():
        process.kill()
        process.join(5)


class Supervisor:
    """One worker process kept running. A subclass gives :meth:`target` (the process's entry point and its
    arguments after the pipe end) and reacts in :meth:`on_message` and :meth:`on_exit`."""

    #: read the pipe on the event loop (``add_reader``) rather than in a reader thread: for a worker that sends
    #: many small messages (a decoder: one per token), it saves a thread wake-up and a loop wake-up per message;
    #: a worker whose messages may be large (batches of embeddings) keeps the thread, so that the loop never
    #: waits on the rest of a message being written
    read_in_loop = False

    def __init__(self, name: str, max_restarts: int = 5, restart_window_s: float = 60.0):
        self.name = name  # the process's name; its reader thread is "<name>-reader"
        self.max_restarts, self.restart_window_s = max_restarts, restart_window_s
        self.process: Any = None
        self.conn: Any = None
        self.generation = 0  # which process of this slot messages come from
        self.pid: int | None = None
        self.info: dict[str, Any] = {}
        self.restarts = 0
        self.crashes: collections.deque[float] = collections.deque()
        self.loading = False  # started, neither ready nor fatal yet: it reads no messages until then
        self.was_ready = False
        self.stopping = False
        self.killed = False  # killed by the main process (a batch it would not give up): not a crash
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready_future: asyncio.Future | None = None
        self._mp = mp.get_context("spawn")
        self._send_lock = threading.Lock()

    # --- what a subclass gives -----------------------------------------------------------------------
    def target(self) -> tuple[Callable[..., None], tuple]:
        raise NotImplementedError

    def on_message(self, msg: tuple) -> None:
        """Every message of the current process (``pid``, ``info`` and ``loading`` already updated by a
        ``"ready"``)."""

    def on_exit(self, code: int | None, outcome: str) -> None:
        """The current process exited (``outcome`` as in the module's doc); a restart follows this call."""

    def launch(self, fn: Callable[..., None], args: tuple) -> tuple[Any, Any]:
        """Start ``fn(conn, *args)`` in a new process: the process and the parent's end of the pipe. Spawn
        here (a subclass whose worker shares nothing else with this process may start it otherwise)."""
        parent, child = self._mp.Pipe()
        proc = self._mp.Process(target=fn, args=(child, *args), name=self.name, daemon=True)
        proc.start()
        child.close()
        return proc, parent

    # --- lifecycle ----------------------------------------------------------------------------------------
    def spawn(self) -> asyncio.Future:
        """Start the process (again); the future resolves when it is ready (see :meth:`settle`)."""
        self.loop = self.loop or asyncio.get_running_loop()
        fn, args = self.target()
        self.generation += 1
        self.pid, self.loading = None, True
        self.process, parent = self.launch(fn, args)
        self.conn = parent
        self.ready_future = self.loop.create_future()
        if self.read_in_loop:
            self.loop.add_reader(parent.fileno(), self._read_ready, self.generation, parent)
        else:
            threading.Thread(target=self._read, args=(self.generation, parent), daemon=True,
                             name=f"{self.name}-reader").start()
        return self.ready_future

    def settle(self, error: Exception | None = None) -> None:
        """Resolve the readiness of the current process: ready, or the error that start-up fails with."""
        fut = self.ready_future
        if fut is not None and not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    def send(self, msg: tuple) -> bool:
        """Send ``msg`` to the process; False when its pipe is gone (the reader sees it exit)."""
        conn = self.conn
        if conn is None:
            return False
        try:
            with self._send_lock:
                conn.send(msg)
            return True
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL the process; it is started again without counting as a crash."""
        if self.process is not None:
            self.killed = True
            self.process.kill()

    def request_stop(self) -> None:
        """No restart from now on; a loading process is killed at once, a ready one told to stop."""
        self.stopping = True
        if self.loading:
            stop_process(self.process, 0)
        else:
            self.send(("stop",))

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop the process, killing it when it has not exited within ``grace`` s."""
        self.request_stop()
        stop_process(self.process, grace)

    # --- the reader thread and the event loop -------------------------------------------------------------
    def _read(self, generation: int, conn: Any) -> None:
        loop = self.loop
        assert loop is not None
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            except Exception as e:  # noqa: BLE001 - an unreadable message: treated as a crash
                log.error("%s sent an unreadable message: %s", self.name, e)
                break
            loop.call_soon_threadsafe(self._message, generation, msg)
        loop.call_soon_threadsafe(self._exited, generation)

    def _read_ready(self, generation: int, conn: Any) -> None:
        """The pipe is readable (``read_in_loop``): one message (the loop calls again while more wait), or
        the process's exit."""
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = None
        except Exception as e:  # noqa: BLE001 - an unreadable message: treated as a crash
            log.error("%s sent an unreadable message: %s", self.name, e)
            msg = None
        if msg is not None:
            self._message(generation, msg)
            return
        self.loop.remove_reader(conn.fileno())
        self._exited(generation)

    def _message(self, generation: int, msg: tuple) -> None:
        if generation != self.generation:
            return
        if msg[0] == "ready":
            self.pid, self.info, self.loading, self.was_ready = msg[1].get("pid"), msg[1], False, True
        elif msg[0] == "fatal":
            self.loading = False
        self.on_message(msg)

    def _exited(self, generation: int) -> None:
        if generation != self.generation:
            return
        code = self.process.exitcode if self.process is not None else None
        self.loading = False
        outcome = self._outcome()
        if outcome == "restarting":
            self.restarts += 1
        self.on_exit(code, outcome)
        if outcome == "restarting":
            self.spawn()

    def _outcome(self) -> str:
        if self.stopping:
            return "stopped"
        if not self.was_ready:
            return "failed"
        if self.killed:
            self.killed = False
            return "restarting"
        now = time.monotonic()
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > self.restart_window_s:
            self.crashes.popleft()
        return "gave up" if len(self.crashes) > self.max_restarts else "restarting"
