import json
import subprocess
import sys

from edgeinfer.testing import BackendConformance
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.models import mlp


class TestExampleConformance(BackendConformance):
    backend_name = "example"
    board = "example-cpu"  # the board profile this plugin registers (edgeinfer_example/boards/)


def test_listed_by_edgeinfer_backends():
    out = subprocess.run(
        [sys.executable, "-m", "edgeinfer.cli", "backends", "--json"], capture_output=True, text=True, check=True
    )
    rows = {b["name"]: b for b in json.loads(out.stdout)["backends"]}
    assert rows["example"]["distribution"] == "edgeinfer-example-backend"
    assert rows["example"]["available"] is True


def test_deploys_to_the_board_it_registers(capfd, tmp_path):
    """`edgeinfer deploy model.onnx --board example-cpu`: the packaged board, fp32 (all the board lists), no
    option the backend does not declare; the bundle runs."""
    boards = json.loads(run_cli(capfd, "boards", "--json").stdout)["boards"]
    assert "example-cpu" in {b["name"] for b in boards}
    model = mlp(tmp_path)
    r = run_cli(capfd, "deploy", str(model.path), "--board", "example-cpu", "-o", str(tmp_path / "b"), "--json",
                "--no-cache")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["backend"], d["board"], d["scheme"], d["golden"]["passed"]) == ("example", "example-cpu", "fp32", True)
    r = run_cli(capfd, "verify", str(tmp_path / "b"), "--json")
    assert r.returncode == 0, r.stderr
