"""examples/firmware.sh runs as an edge box's firmware would run it: under dash (POSIX sh), on the host board
with the tiny ONNX test model, plan → deploy → golden → serve → one request → stop, branching on exit codes and
JSON fields; with an unknown board (exit 2, the error branch) and a model that does not fit (exit 1) it stops at
the plan, and with its port taken it stops with serve's exit code (2). The four runs go side by side; deploy
reuses the conversion cache."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import numpy as np
from test_readme import _env, _free_port

from edgeinfer.testing.models import mlp

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "firmware.sh"
SH = shutil.which("dash") or "sh"


def _start(work: Path, model: str, board: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([SH, str(SCRIPT), model, board, str(work), f"x={work.parent / 'x.npy'}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work.parent)


def test_the_script_is_posix_sh() -> None:
    assert SCRIPT.read_text().startswith("#!/bin/sh\n")
    p = subprocess.run([SH, "-n", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0 and not p.stderr, p.stderr


def test_firmware_goes_plan_to_stop_and_branches_on_exit_codes_and_json(tmp_path: Path) -> None:
    m = mlp(tmp_path)
    np.save(tmp_path / "x.npy", m.feeds["x"])
    env = {**_env(), "PORT": str(_free_port())}
    ok = _start(tmp_path / "ok", str(m.path), "host", env)
    unknown = _start(tmp_path / "unknown", str(m.path), "no-such-board", env)
    too_big = _start(tmp_path / "big", "qwen3-8b", "rk3588-4g", env)
    with socket.socket() as taken:  # serve cannot listen there: its exit code is the script's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = _start(tmp_path / "busy", str(m.path), "host", {**env, "PORT": str(taken.getsockname()[1])})
        out, err = busy.communicate(timeout=300)
    assert busy.returncode == 2, err
    assert out.splitlines()[-1] == "firmware: golden: passed" and "firmware: serve exited 2: error: " in err, err
    assert "Address already in use" in err, err

    out, err = unknown.communicate(timeout=120)
    assert unknown.returncode == 2, err
    assert "firmware: plan failed (exit 2, kind " in err and "unknown board 'no-such-board'" in err, err
    error = (tmp_path / "unknown" / "plan.json").read_text()
    if error:  # the {"error": {...}} object of --json failures: its kind is what the script branches on
        assert json.loads(error)["error"]["kind"] == "unknown_board"
        assert "kind unknown_board" in err and "install its plugin or pass its YAML" in err, err
    assert not (tmp_path / "unknown" / "bundle").exists()

    out, err = too_big.communicate(timeout=120)
    assert too_big.returncode == 1, err
    assert "firmware: qwen3-8b does not fit rk3588-4g: needs" in err and not out, err

    out, err = ok.communicate(timeout=300)
    assert ok.returncode == 0, err + (tmp_path / "ok" / "serve.log").read_text()[-3000:]
    assert out.splitlines() == ["firmware: plan: fits (onnxruntime, fp16)",
                                f"firmware: deploy: {tmp_path / 'ok' / 'bundle'} on onnxruntime",
                                "firmware: golden: passed", f"firmware: serve: ready on port {env['PORT']}",
                                f"firmware: request: y {[m.feeds['x'].shape[0], 8]}",  # mlp: [batch, 16] -> [8]
                                "firmware: done"], err
    assert (tmp_path / "ok" / "bundle" / "manifest.json").is_file()
    assert "Traceback" not in (tmp_path / "ok" / "serve.log").read_text()


def test_a_json_error_object_names_its_kind_and_the_fix(tmp_path: Path) -> None:
    """An `edgeinfer` stand-in (a shell script, not the CLI) prints the --json error object of a missing runtime
    package: the script reports its kind and message, gives the install hint and exits with its code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "edgeinfer"
    stand_in.write_text("#!/bin/sh\n"
                        "echo '{\"error\": {\"code\": 3, \"kind\": \"package_missing\", \"message\": "
                        "\"openvino_genai is not installed\"}}'\necho 'error: openvino_genai' >&2\nexit 3\n")
    stand_in.chmod(0o755)
    env = _env()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    p = subprocess.run([SH, str(SCRIPT), "m", "b", str(tmp_path / "w"), "x=x.npy"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert p.stderr.splitlines() == [
        "firmware: plan failed (exit 3, kind package_missing): openvino_genai is not installed",
        "firmware: install the board's runtime (edgeinfer doctor)"]
