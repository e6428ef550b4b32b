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


#: every ``kind`` a failure reports under ``--json`` (``{"error": {"code", "kind", "message"}}``), with its
#: exit code; the README's error table lists the same set and a test holds them together.
KINDS = {
    "bad_input": USAGE,  # an argument, option or file the user gave is wrong
    "model_not_found": USAGE,  # the model path or reference does not exist
    "model_invalid": USAGE,  # the model exists but cannot be read or converted as given
    "not_supported": USAGE,  # the board's backend cannot do this (architecture, scheme, option)
    "bundle_missing": USAGE,  # no bundle at the path given
    "bundle_damaged": USAGE,  # a bundle whose files do not match its seal or manifest
    "unknown_board": USAGE,  # no board profile of that name
    "port_in_use": USAGE,  # serve: the address is taken
    "does_not_fit": NEGATIVE,  # plan: the model does not fit the board
    "golden_failed": NEGATIVE,  # the converted model is not close enough to the reference
    "backend_unavailable": UNAVAILABLE,  # the backend's plugin is not installed or has no usable device
    "package_missing": UNAVAILABLE,  # a runtime package this bundle or board needs is not installed
    "plugin_failed": UNAVAILABLE,  # a plugin raised or returned something wrong in convert/open/infer/decode
    "internal_error": UNAVAILABLE,  # a bug in edgeinfer itself
    "interrupted": INTERRUPTED,  # Ctrl-C or SIGTERM
}


class EdgeInferError(Exception):
    """Base class of every error edgeinfer raises on purpose. ``kind`` (one of :data:`KINDS`) names the
    failure for scripts; a subclass sets its default and a raise site may pass a more precise one."""

    exit_code = USAGE
    kind = "bad_input"

    def __init__(self, message: str, hint: str | None = None, *, kind: str | None = None,
                 details: dict | None = None):
        self.message = message
        self.hint = hint
        self.details = details  # JSON-able figures behind the message (``--json``: ``error.details``)
        if kind is not None:
            if kind not in KINDS:
                raise ValueError(f"unknown error kind {kind!r}")
            self.kind = kind
        super().__init__(message if not hint else f"{message} ({hint})")

    def one_line(self) -> str:
        text = str(self).replace("\n", " ").strip()
        return " ".join(text.split())


class InputError(EdgeInferError):
    """A file, argument or option the user gave is wrong."""


class ModelError(InputError):
    """A model file cannot be read or converted."""

    kind = "model_invalid"


class FeedError(InputError):
    """Feeds do not match a session's input specs."""


class BoardError(InputError):
    """A board profile is unknown or invalid."""

    kind = "unknown_board"


class BackendUnavailableError(EdgeInferError):
    """A backend is not installed, not importable, or has no usable device."""

    exit_code = UNAVAILABLE
    kind = "backend_unavailable"


class BackendError(EdgeInferError):
    """The backend failed while doing something that should have worked."""

    exit_code = UNAVAILABLE
    kind = "plugin_failed"


class CheckFailed(EdgeInferError):
    """A negative verdict: a model does not fit, a golden check failed."""

    exit_code = NEGATIVE
    kind = "does_not_fit"


class Interrupted(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C so that every ``finally`` (temporaries) runs on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def check_text(text: str, what: str) -> str:
    """``text`` unchanged, or InputError when it cannot be UTF-8 encoded: bytes that were not UTF-8 reach
    Python as surrogate escapes (argv, stdin: PEP 383), and JSON can spell a lone UTF-16 surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        if 0xDC80 <= ch <= 0xDCFF:  # surrogateescape of one undecodable byte
            raise InputError(f"{what} is not valid UTF-8 text (byte 0x{ch - 0xDC00:02x} at character {e.start})",
                             "give UTF-8 text") from None
        raise InputError(f"{what} holds a lone UTF-16 surrogate (U+{ch:04X} at character {e.start})",
                         "give valid Unicode text") from None
    return text


def one_line(e: BaseException) -> str:
    """Any exception as one line of at most 500 characters (a worker's ``fatal`` message); ours say what to do."""
    if isinstance(e, EdgeInferError):
        return e.one_line()
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:500]
