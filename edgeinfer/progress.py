"""Progress on stderr for long steps; silent with --json or when stderr is not a terminal.

With ``EDGEINFER_STEP_LOG`` naming a file, each step's name is appended to it as the step starts, whether
or not progress is shown: tests wait on it to signal a run inside a given step (tests/test_interrupts.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class Progress:
    def __init__(self, enabled: bool | None = None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.timings: dict[str, float] = {}

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        """A spinner while the step runs, then one line with its duration."""
        started(description)
        t0 = time.perf_counter()
        if not self.enabled:
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
        """A progress bar over ``items``."""
        started(description)
        t0 = time.perf_counter()
        if not self.enabled:
            yield from items
        else:
            from rich.progress import track

            yield from track(items, description=description, total=total, console=_stderr_console(), transient=True)
        self.timings[description] = time.perf_counter() - t0

    def note(self, message: str) -> None:
        """A line for the user (always shown on stderr, even when bars are off, unless quiet)."""
        print(message, file=sys.stderr)


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
