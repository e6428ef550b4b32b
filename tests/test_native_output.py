"""edgeinfer.contract.native_output: what C code and libraries write around convert / load stays off stdout,
shows with --verbose, and its tail shows when the call fails."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import threading

import pytest

from edgeinfer.contract import native_output
from edgeinfer.errors import InputError, ModelError

LIBC = ctypes.CDLL(None)


def chatter(tag: str) -> None:
    """Output as native libraries make it: C stdio (buffered off a terminal), raw fd writes, print."""
    LIBC.printf(f"{tag} printf\n".encode())
    os.write(1, f"{tag} fd1\n".encode())
    os.write(2, f"{tag} fd2\n".encode())
    print(f"{tag} print")


def fd_identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def test_native_chatter_is_hidden_and_the_descriptors_come_back(capfd, monkeypatch) -> None:
    monkeypatch.delenv("EDGEINFER_VERBOSE", raising=False)
    before = fd_identity(1), fd_identity(2), sys.stdout
    with native_output():
        chatter("inside")
    assert (fd_identity(1), fd_identity(2), sys.stdout) == before
    print("after")
    out, err = capfd.readouterr()
    assert out == "after\n"
    assert "inside" not in err


def test_a_failure_shows_the_tail_and_an_edgeinfer_error_does_not(capfd, monkeypatch) -> None:
    monkeypatch.delenv("EDGEINFER_VERBOSE", raising=False)
    with pytest.raises(RuntimeError, match="toolkit crashed"), native_output():
        chatter("before-crash")
        raise RuntimeError("toolkit crashed")
    out, err = capfd.readouterr()
    assert out == ""
    assert "native output before the failure" in err
    for line in ("before-crash printf", "before-crash fd1", "before-crash fd2", "before-crash print"):
        assert f"  {line}\n" in err + "\n", err
    with pytest.raises(ModelError), native_output():
        try:
            chatter("wrapped")
            raise RuntimeError("toolkit crashed")
        except RuntimeError as e:
            raise ModelError("the toolkit could not convert m.onnx") from e
    out, err = capfd.readouterr()
    assert out == "" and "  wrapped fd2" in err
    with pytest.raises(InputError), native_output():
        chatter("user-error")
        raise InputError("bad option")
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # the plugin's own one-line error says it all; the CLI prints that


def test_verbose_sends_stdout_chatter_to_stderr(capfd, monkeypatch) -> None:
    monkeypatch.setenv("EDGEINFER_VERBOSE", "1")
    with native_output():
        chatter("loud")
    out, err = capfd.readouterr()
    assert out == ""
    for line in ("loud printf", "loud fd1", "loud fd2", "loud print"):
        assert line in err


def test_a_stdout_log_handler_made_before_is_contained_and_restored(capfd, monkeypatch) -> None:
    """NNCF binds a StreamHandler to sys.stdout at its import; its tables must not reach stdout."""
    monkeypatch.delenv("EDGEINFER_VERBOSE", raising=False)
    log = logging.getLogger("edgeinfer-test-stdout-handler")
    handler = logging.StreamHandler(sys.stdout)
    log.addHandler(handler)
    log.propagate = False
    try:
        with native_output():
            log.warning("bit-width table")
        assert handler.stream is sys.stdout
        log.warning("after the block")
    finally:
        log.removeHandler(handler)
    out, _ = capfd.readouterr()
    assert out == "after the block\n"


def test_nested_and_overlapping_threads_restore_once_the_last_leaves(capfd, monkeypatch) -> None:
    monkeypatch.delenv("EDGEINFER_VERBOSE", raising=False)
    before = fd_identity(1)
    entered, release = threading.Event(), threading.Event()

    def worker() -> None:
        with native_output():
            entered.set()
            release.wait(10)
            os.write(1, b"worker fd1\n")

    t = threading.Thread(target=worker)
    with native_output():
        t.start()
        assert entered.wait(10)
        with native_output():
            os.write(1, b"nested fd1\n")
    assert fd_identity(1) != before  # the worker is still inside
    release.set()
    t.join(10)
    assert fd_identity(1) == before
    out, _ = capfd.readouterr()
    assert out == ""


SCRIPT = """
import ctypes, os, sys
from edgeinfer.contract import native_output
with native_output():
    ctypes.CDLL(None).printf(b"C stdio, buffered off a terminal\\n")
    os.write(1, b"native stdout\\n")
    os.write(2, b"native stderr\\n")
    print("edgeinfer's own progress", file=sys.stderr)
print('{"answer": 1}')
"""


def test_in_a_process_stdout_holds_only_the_answer_and_our_stderr_still_shows() -> None:
    """A process of its own: there sys.stderr writes to fd 2 (under pytest it does not)."""
    # C stdio buffers off a terminal unless PYTHONUNBUFFERED (it unbuffers C's stdout too)
    env = {k: v for k, v in os.environ.items() if k not in ("EDGEINFER_VERBOSE", "PYTHONUNBUFFERED")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == '{"answer": 1}\n'
    assert proc.stderr == "edgeinfer's own progress\n"
