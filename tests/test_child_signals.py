"""Children edgeinfer does not own get default signal handlers: a SIGTERM ends them quietly (edgeinfer/cli)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

FORKED_CHILD = """
import multiprocessing as mp, sys, time
from edgeinfer import cli

cli.install_signal_handlers()  # what `edgeinfer` (cli.main) does at start-up
ctx = mp.get_context("fork")  # how a library starts a helper (openvino-telemetry's sender)
ready = ctx.Event()

def helper():
    ready.set()
    time.sleep(60)

p = ctx.Process(target=helper)
p.start()
assert ready.wait(60)
p.terminate()  # SIGTERM, as that library does to its helper after a timeout
p.join(60)
print(p.exitcode)
"""


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "other-thread"])
def test_a_child_forked_from_edgeinfer_dies_of_sigterm_quietly(in_thread):
    """Not ours: the child gets the default SIGTERM action, not edgeinfer's Interrupted (no traceback, -15)."""
    code = FORKED_CHILD if not in_thread else (
        "import threading\n" + FORKED_CHILD.replace("p = ctx.Process(target=helper)\np.start()",
                                                    "p = ctx.Process(target=helper)\n"
                                                    "t = threading.Thread(target=p.start)\nt.start()\nt.join()"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(-signal.SIGTERM), proc.stdout + proc.stderr
    assert "Interrupted" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
