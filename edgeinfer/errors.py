"""Errors a user can cause, and the exit codes the CLI maps them to.

Every error carries a message that says what is wrong *and* what to do; the CLI
prints it on one line and exits with ``exit_code`` (no traceback unless --debug).
"""

from __future__ import annotations

OK = 0
NEGATIVE = 1  # the answer is "no": does not fit, check failed
USAGE = 2  # bad input or usage
UNAVAILABLE = 3  # backend or device unavailable
INTERRUPTED = 130  # 128 + SIGINT, the shell convention; SIGTERM exits 128 + 15 = 143


class EdgeInferError(Exception):
    """Base class of every error edgeinfer raises on purpose."""

    exit_code = USAGE

    def __init__(self, message: str, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message} ({hint})")

    def one_line(self) -> str:
        text = str(self).replace("\n", " ").strip()
        return " ".join(text.split())


class InputError(EdgeInferError):
    """A file, argument or option the user gave is wrong."""


class ModelError(InputError):
    """A model file cannot be read or converted."""


class FeedError(InputError):
    """Feeds do not match a session's input specs."""


class BoardError(InputError):
    """A board profile is unknown or invalid."""


class BackendUnavailableError(EdgeInferError):
    """A backend is not installed, not importable, or has no usable device."""

    exit_code = UNAVAILABLE


class BackendError(EdgeInferError):
    """The backend failed while doing something that should have worked."""

    exit_code = UNAVAILABLE


class CheckFailed(EdgeInferError):
    """A negative verdict: a model does not fit, a golden check failed."""

    exit_code = NEGATIVE


class Interrupted(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C so that every ``finally`` (temporaries) runs on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
