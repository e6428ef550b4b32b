"""Progress on stderr for long steps.

On a terminal a step shows a spinner (a loop a bar) while it runs, then one line with its duration. Off a
terminal (a log file, CI) and with ``--json``, a plain line every ``EDGEINFER_PROGRESS_INTERVAL`` seconds
(default 10) while a step runs — the step, item i/n of a loop, the time elapsed — so a log does not look
hung; a step shorter than that prints nothing. ``edgeinfer --quiet`` turns both off; notes stay.

With ``EDGEINFER_STEP_LOG`` naming a file, each step's name is appended to it as the step starts, whether
or not progress is shown: tests wait on it to signal a run inside a given step (tests/test_interrupts.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

INTERVAL_ENV = "EDGEINFER_PROGRESS_INTERVAL"
QUIET_ENV = "EDGEINFER_QUIET"
DEFAULT_INTERVAL = 10.0


class Progress:
    """``enabled``: the live display (None: when stderr is a terminal); ``plain``: periodic plain lines where
    there is no live display. ``--quiet`` turns both off. ``Progress(enabled=False)``, the library default,
    is silent; a command takes :meth:`for_command`."""

    def __init__(self, enabled: bool | None = None, plain: bool = False):
        live = sys.stderr.isatty() if enabled is None else enabled
        self.enabled = live and not quiet()
        self.plain = plain and not self.enabled and not quiet()
        self.timings: dict[str, float] = {}

    @classmethod
    def for_command(cls, as_json: bool = False) -> Progress:
        """A command's progress: live on a terminal (not under ``--json``), plain lines otherwise."""
        return cls(enabled=not as_json and sys.stderr.isatty(), plain=True)

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        """A spinner while the step runs, then one line with its duration (plain: a line every interval)."""
        started(description)
        t0 = time.perf_counter()
        if not self.enabled:
            with Heartbeat(description, None, self.plain):
                yield
            self.timings[description] = time.perf_counter() - t0
            return
        from rich.console import Console

        console = Console(stderr=True)
        with console.status(description + " …"):
            yield
        dt = time.perf_counter() - t0
        self.timings[description] = dt
        console.print(f"[green]✓[/green] {description} ({dt:.1f} s)")

    def track(self, items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
        """A progress bar over ``items`` (plain: a line with item i/n every interval)."""
        started(description)
        t0 = time.perf_counter()
        if not self.enabled:
            if total is None and hasattr(items, "__len__"):
                total = len(items)  # type: ignore[arg-type]
            with Heartbeat(description, total, self.plain) as beat:
                for item in items:
                    yield item
                    beat.done += 1
        else:
            from rich.progress import track

            yield from track(items, description=description, total=total, console=_stderr_console(), transient=True)
        self.timings[description] = time.perf_counter() - t0

    def note(self, message: str) -> None:
        """A line for the user (shown on stderr even when progress is off)."""
        print(message, file=sys.stderr)


class Heartbeat:
    """While the block runs, every :func:`interval` seconds one line on the user's stderr: ``description``,
    item ``done``/``total`` when counted, the time elapsed; a last line with the duration once a line was
    written. The lines go to stderr's descriptor as it is at the start, so a capture of native output that
    starts later (contract.native_output) does not swallow them."""

    def __init__(self, description: str, total: int | None, on: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.description, self.total, self.on, self.clock = description, total, on, clock
        self.done = 0
        self.lines = 0
        self._stop = threading.Event()

    def __enter__(self) -> Heartbeat:
        if self.on:
            self.t0 = self.clock()
            self._write, self._close = _user_stderr()
            self._thread = threading.Thread(target=self._run, name="edgeinfer-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.on:
            return
        self._stop.set()
        self._thread.join()
        if self.lines and exc[0] is None:
            self._write(f"{self.description}: done in {_seconds(self.clock() - self.t0)}\n")
        self._close()

    def line(self) -> str:
        count = f"{self.done}/{self.total}, " if self.total is not None else (
            f"{self.done} done, " if self.done else "")
        return f"{self.description}: {count}{_seconds(self.clock() - self.t0)} elapsed\n"

    def _run(self) -> None:
        every = interval()
        while not self._stop.wait(every):
            self._write(self.line())
            self.lines += 1


def interval() -> float:
    """Seconds between plain progress lines: ``EDGEINFER_PROGRESS_INTERVAL`` (tests set a short one), else 10."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value > 0 else DEFAULT_INTERVAL


def quiet() -> bool:
    """Whether the user turned progress off (``edgeinfer --quiet``)."""
    return os.environ.get(QUIET_ENV) == "1"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def _user_stderr() -> tuple[Callable[[str], Any], Callable[[], None]]:
    """(write, close) for stderr as it is now: a descriptor of its own when it has one."""
    try:
        fd = os.dup(sys.stderr.fileno())
    except Exception:
        stream = sys.stderr
        return (lambda text: (stream.write(text), stream.flush())), (lambda: None)
    lock = threading.Lock()

    def write(text: str) -> None:
        with lock:
            try:
                os.write(fd, text.encode("utf-8", "replace"))
            except OSError:  # stderr's reader went away: progress is not worth failing the work for
                pass

    return write, lambda: os.close(fd)


STEP_LOG_ENV = "EDGEINFER_STEP_LOG"


def started(description: str) -> None:
    """Append ``description`` to the ``EDGEINFER_STEP_LOG`` file, if one is named (the step starts now)."""
    path = os.environ.get(STEP_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(description + "\n")


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


VERBOSE_ENV = "EDGEINFER_VERBOSE"


def verbose() -> bool:
    """Whether the user asked for third-party output (``edgeinfer --verbose`` / ``--debug``)."""
    return os.environ.get(VERBOSE_ENV) == "1"
