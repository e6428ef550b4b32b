"""The real CLI in the test's own process: ``edgeinfer ARGS`` without an interpreter start-up and a torch,
openvino or toolkit import per call (about 1-6 s each on the 2-core CI machine).

Behaviour of the process itself (signals, how stdin decodes, what start-up imports, code that must not run
in the test process) still needs ``python -m edgeinfer.cli`` in a subprocess.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from typing import Any, Callable


def run_cli(capfd: Any, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``edgeinfer ARGS`` through ``edgeinfer.cli.invoke`` (what ``main`` runs), as a CompletedProcess;
    ``env`` is set for the command only.

    ``capfd`` is pytest's fixture: output is read at the file descriptors, so what a library writes there
    still shows. Python warnings are filtered and printed on stderr as in a fresh interpreter under ``main``
    (pytest would otherwise collect them out of sight); the warning filters, environment variables and
    logger levels the command sets for its process are undone after, and a log handler a library created
    on the captured streams while the command imported it (NNCF's, at import) is pointed at the real ones.
    """
    from edgeinfer import cli
    from edgeinfer.contract.names import NOISY_LOGGERS

    cli._attach_optional_commands()
    capfd.readouterr()
    formatwarning, environ = warnings.formatwarning, dict(os.environ)
    os.environ.update(env or {})
    levels = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    captured = {id(sys.stdout): sys.__stdout__, id(sys.stderr): sys.__stderr__}
    with warnings.catch_warnings():
        _fresh_interpreter_filters()
        warnings.showwarning = _to_stderr
        warnings.formatwarning = cli._one_line_warning
        try:
            code = cli.invoke(list(args))
        finally:  # what the command set for its process (quiet_third_party) does not outlive it here
            warnings.formatwarning = formatwarning
            os.environ.clear()
            os.environ.update(environ)
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            _off_captured_streams(captured)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["edgeinfer", *args], code, out, err)


def in_process_cli() -> tuple[Callable[..., subprocess.CompletedProcess], Any]:
    """``cli, _bind_capfd = in_process_cli()`` at a test module's top: ``cli(*args, env=None)`` is
    :func:`run_cli` with the running test's ``capfd``, bound by the autouse fixture ``_bind_capfd``, for a
    module whose cases are about what commands answer, not about the process."""
    import pytest

    fds: list[Any] = []

    @pytest.fixture(autouse=True)
    def _bind_capfd(capfd: Any) -> Any:
        fds.append(capfd)
        yield
        fds.clear()

    def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return run_cli(fds[-1], *args, env=env)

    return cli, _bind_capfd


def _off_captured_streams(captured: dict[int, Any]) -> None:
    """Point stream handlers bound to pytest's capture streams (closed after the test) at the real ones."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for lg in loggers:
        for h in lg.handlers:
            real = captured.get(id(getattr(h, "stream", None)))
            if isinstance(h, logging.StreamHandler) and real is not None:
                h.setStream(real)


def _fresh_interpreter_filters() -> None:
    """The filters CPython starts with, without -W or PYTHONWARNINGS
    (https://docs.python.org/3/library/warnings.html#default-warning-filter)."""
    warnings.resetwarnings()
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category, append=True)


def _to_stderr(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
