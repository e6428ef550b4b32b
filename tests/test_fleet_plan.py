"""`edgeinfer plan --fleet`: which model fits which node type and how many replicas one node holds.

Expected replica counts are worked out here by hand from the board's memory facts (`boards show`) and the
planner's breakdown of one replica (`plan --json`): replicas = floor(memory left after the reserve, per
chip when the board's memory is dedicated to each of its chips, / (weights + kv + activations + runtime)).
"""

from __future__ import annotations

import json
import shutil

from helpers import HEAVY, imported_modules

from edgeinfer.planning.boards import boards_dirs
from edgeinfer.testing.cli import in_process_cli

GIB = 2**30
# ``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): what plan answers, not the process
# (test_plan_fleet_is_light checks the start-up imports in a fresh interpreter).
cli, _bind_capfd = in_process_cli()


def _json(*args: str) -> dict:
    proc = cli(*args, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def _per_replica(model: str, board: str, *opts: str) -> int:
    bd = _json("plan", model, "--board", board, *opts)["memory"]["breakdown"]
    return bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]


def _board_pool(board: str) -> int:
    b = _json("boards", "show", board)
    return int(b["memory_total_gib"]["value"] * GIB) - int(b["os_reserve_gib"]["value"] * GIB)


def test_replicas_per_node_from_board_memory_and_breakdown(tmp_path):
    (tmp_path / "fleet.yaml").write_text(
        "nodes:\n  - {board: rk3588-16g, count: 4}\n  - {board: atlas-300i-duo-96g}\n"
        "models:\n  - {model: qwen3-0.6b, ctx: 2048, slots: 4, name: small}\n")
    report = _json("plan", "--fleet", str(tmp_path / "fleet.yaml"))
    by_board = {p["board"]: p for p in report["placements"]}
    rk = _per_replica("qwen3-0.6b", "rk3588-16g", "--ctx", "2048", "--batch", "4")
    rk_want = _board_pool("rk3588-16g") // rk  # shared memory: one pool
    assert rk_want >= 2  # the case tests more than "fits once"
    assert by_board["rk3588-16g"]["replicas_per_node"] == rk_want
    assert by_board["rk3588-16g"]["replicas_total"] == 4 * rk_want
    duo = _per_replica("qwen3-0.6b", "atlas-300i-duo-96g", "--ctx", "2048", "--batch", "4")
    duo_want = 2 * ((_board_pool("atlas-300i-duo-96g") // 2) // duo)  # 2 chips, each its own memory
    assert by_board["atlas-300i-duo-96g"]["replicas_per_node"] == duo_want
    assert report["fits"] and report["unplaced"] == [] and {p["model"] for p in report["placements"]} == {"small"}


def test_a_model_without_ctx_is_planned_at_the_context_plan_and_deploy_take(tmp_path):
    (tmp_path / "fleet.yaml").write_text("nodes: [{board: rk3588-16g}]\nmodels: [{model: qwen3-0.6b, slots: 2}]\n")
    [p] = _json("plan", "--fleet", str(tmp_path / "fleet.yaml"))["placements"]
    # qwen3-0.6b's limit is 40960 tokens: plan and deploy take 2048 when no --ctx is given (docs/planner.md)
    want = _board_pool("rk3588-16g") // _per_replica("qwen3-0.6b", "rk3588-16g", "--ctx", "2048", "--batch", "2")
    assert p["replicas_per_node"] == want
    assert _per_replica("qwen3-0.6b", "rk3588-16g", "--batch", "2") == \
        _per_replica("qwen3-0.6b", "rk3588-16g", "--ctx", "2048", "--batch", "2")


def test_a_model_that_fits_nowhere_exits_1_and_is_named(tmp_path):
    (tmp_path / "fleet.yaml").write_text(
        "nodes: [{board: rk3588-4g, count: 3}]\nmodels: [{model: qwen3-8b, quant: w8a8, ctx: 4096}]\n")
    proc = cli("plan", "--fleet", str(tmp_path / "fleet.yaml"), "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    [p] = report["placements"]
    assert report["unplaced"] == ["Qwen/Qwen3-8B"] and p["replicas_per_node"] == 0
    per = _per_replica("qwen3-8b", "rk3588-4g", "--quant", "w8a8", "--ctx", "4096")
    assert p["reasons"][0].startswith(f"one replica needs {per / GIB:.2f} GiB")


def test_board_file_next_to_the_fleet_file(tmp_path):
    shutil.copy(boards_dirs()[0] / "rk3588-8g.yaml", tmp_path / "my-board.yaml")
    (tmp_path / "fleet.yaml").write_text("nodes: [{board: my-board.yaml}]\nmodels: [{model: qwen3-0.6b}]\n")
    report = _json("plan", "--fleet", str(tmp_path / "fleet.yaml"))
    assert report["placements"][0]["board"] == "rk3588-8g" and report["fits"]


def test_bad_fleet_files_are_one_line_exit_2(tmp_path):
    cases = {"broken.yaml": "nodes: [\n", "key.yaml": "nodes: [{board: rk3588-8g, cnt: 2}]\nmodels: [{model: x}]\n",
             "list.yaml": "- a\n", "board.yaml": "nodes: [{board: rk9999}]\nmodels: [{model: qwen3-0.6b}]\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        proc = cli("plan", "--fleet", str(tmp_path / name))
        assert proc.returncode == 2, (name, proc.stderr)
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "nodes.0.cnt" in cli("plan", "--fleet", str(tmp_path / "key.yaml")).stderr


def test_plan_fleet_is_light(tmp_path):
    (tmp_path / "fleet.yaml").write_text("nodes: [{board: rk3588-8g}]\nmodels: [{model: qwen3-0.6b}]\n")
    code = (f"import sys; sys.argv=['edgeinfer','plan','--fleet',{str(tmp_path / 'fleet.yaml')!r}]\n"
            "from edgeinfer.cli import main\ntry:\n main()\nexcept SystemExit:\n pass")
    assert not imported_modules(code) & (set(HEAVY) | {"ray"})
