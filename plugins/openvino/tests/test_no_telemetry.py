"""Nothing phones home: an OpenVINO decoder deploy (optimum-intel export, NNCF, GenAI golden check) opens no
network socket and starts no telemetry child (edgeinfer/telemetry.py).

The deploy runs in a subprocess whose sitecustomize installs an audit hook (https://docs.python.org/3/library/
audit_events.html) that records every socket, fork and process-start event, in that process and in any
child forked from it, to a file. Without the switches, openvino-telemetry forks one child per event, each
resolving www.google-analytics.com, and writes ~/intel/openvino_ga_cid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

AUDIT = '''
import json, os, sys
_LOG = os.environ["EDGEINFER_AUDIT_LOG"]
_EVENTS = {"hook.installed", "socket.connect", "socket.getaddrinfo", "socket.sendto", "socket.sendmsg",
           "os.fork", "os.forkpty", "subprocess.Popen", "os.posix_spawn", "os.exec"}
def _hook(event, args):
    if event in _EVENTS:
        with open(_LOG, "a") as f:
            f.write(json.dumps([os.getpid(), event, repr(args)[:300]]) + "\\n")
sys.addaudithook(_hook)
_hook("hook.installed", ())
'''
LOCAL = ("127.", "'localhost'", "'::1'", "AF_UNIX")


def test_openvino_decoder_deploy_sends_nothing(tmp_path):
    pytest.importorskip("optimum.intel")
    from edgeinfer.testing.llm import model_dir

    site, home, log = tmp_path / "site", tmp_path / "home", tmp_path / "audit.jsonl"
    site.mkdir()
    home.mkdir()
    (site / "sitecustomize.py").write_text(AUDIT)
    env = {k: v for k, v in os.environ.items() if k not in ("DO_NOT_TRACK", "HF_HUB_DISABLE_TELEMETRY", "CI")}
    env.update(HOME=str(home), EDGEINFER_CACHE_DIR=str(tmp_path / "cache"), EDGEINFER_AUDIT_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "deploy", str(model_dir()), "--board",
                           "core-ultra-155h", "--ctx", "64", "-o", str(tmp_path / "bundle"), "--json"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(e[1] == "hook.installed" for e in events)  # the audit hook was in place
    network = [e for e in events if e[1].startswith("socket.") and not any(s in e[2] for s in LOCAL)]
    forks = [e for e in events if e[1] in ("os.fork", "os.forkpty")]
    assert not network, network
    assert not forks, forks  # openvino-telemetry's sender is a forked child; edgeinfer's own children are spawned
    assert not (home / "intel").exists()  # openvino-telemetry's client id and stats files
    assert "Traceback" not in proc.stderr
