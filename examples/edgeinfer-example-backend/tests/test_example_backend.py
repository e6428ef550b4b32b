import json
import subprocess
import sys

import pytest
import yaml
from edgeinfer_example import BOARD

from edgeinfer.testing import BackendConformance
from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.llm import model_dir
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


@pytest.mark.parametrize("args, needle", [
    (["--shape", "x=2x16"], "takes no convert option 'shapes'"),
    (["--buckets", "1x16,2x16"], "takes no convert option 'shapes'"),
])
def test_what_needs_an_undeclared_option_is_refused_before_any_work(capfd, tmp_path, args, needle):
    """Static shapes and buckets reach convert as the option `shapes`, which this backend does not declare."""
    model = mlp(tmp_path)  # a free batch axis
    r = run_cli(capfd, "deploy", str(model.path), "--board", "example-cpu", "-o", str(tmp_path / "b"), *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert not (tmp_path / "b").exists()


def test_default_scheme_is_one_the_backend_converts(capfd, tmp_path):
    """A board runtime listing fp16 and fp32: deploy's default for encoders is fp16 only where the backend
    converts fp16; this one converts fp32 only."""
    import yaml
    from edgeinfer_example import BOARD

    board = yaml.safe_load(BOARD.read_text())
    board["runtimes"]["example-ref"]["schemes"] = ["fp16", "fp32"]
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(dict(board, name="example-cpu-fp16")))
    r = run_cli(capfd, "plan", str(mlp(tmp_path).path), "--board", str(tmp_path / "b.yaml"), "--json")
    build = json.loads(r.stdout)["build"]
    assert (r.returncode, build["scheme"], build["buildable"]) == (0, "fp32", True)


def test_a_runtime_unknown_to_the_core_gets_overhead_and_speed_from_the_board(capfd, tmp_path):
    """No core data for runtime example-ref: the board profile's `overhead_mib` is the plan's runtime memory, and
    its inline `speed` constants give the decode estimate, 1 / (t0 + bytes per token / (bw_fraction x bw))."""
    board = yaml.safe_load(BOARD.read_text())
    overhead = board["runtimes"]["example-ref"]["overhead_mib"]
    r = run_cli(capfd, "plan", str(mlp(tmp_path).path), "--board", "example-cpu", "--json")
    memory = json.loads(r.stdout)["memory"]
    assert memory["breakdown"]["runtime"] == overhead["value"] * 2**20
    assert memory["details"]["runtime"]["source"] == overhead["source"]

    runtime = dict(board["runtimes"]["example-ref"], kinds=["decoder"],
                   speed={"fp32": {"t0_ms": 5.0, "bw_fraction": 0.5, "source": "this test's constants"}})
    (tmp_path / "llm.yaml").write_text(yaml.safe_dump(dict(board, name="example-llm",
                                                           runtimes={"example-ref": runtime})))
    r = run_cli(capfd, "plan", str(model_dir()), "--board", str(tmp_path / "llm.yaml"), "--json")
    est = json.loads(r.stdout)["estimates"]
    seconds = 5.0e-3 + est["bytes_per_token"] / (0.5 * board["bandwidth_gbps"]["value"] * 1e9)
    assert est["decode_tokens_per_s"] == pytest.approx(1 / seconds, rel=1e-3)
    assert "this test's constants" in est["basis"]
