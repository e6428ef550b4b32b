"""`edgeinfer plan` / `edgeinfer boards` through the real CLI group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeinfer.cli import cli
from edgeinfer.cli.plan import boards_cmd, plan_cmd
from edgeinfer.contract.registry import registry

# edgeinfer.cli attaches these in main(); attach them here for CliRunner (idempotent)
cli.add_command(plan_cmd)
cli.add_command(boards_cmd)


def run(*args):
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r


def test_plan_json_only_json_exit_0():
    r = run("plan", "Qwen/Qwen3-8B", "--board", "rk3588-16g", "--quant", "w8a8", "--ctx", "4096", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["fits"] is True
    assert d["memory"]["breakdown"]["kv_cache"] == 144 * 1024 * 4096
    assert d["estimates"]["decode_tokens_per_s"] > 0


def test_does_not_fit_exit_1_with_table():
    r = run("plan", "Qwen/Qwen3-8B", "--board", "rk3588-8g", "--quant", "w8a8")
    assert r.exit_code == 1
    assert "DOES NOT FIT" in r.stdout and "rk3588-16g" in r.stdout and "weights" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["plan", "qwen3-8b", "--board", "rk3588-16"], "rk3588-16g"),
    (["plan", "qwen3-8b", "--board", "rk3588-8g", "--quant", "w4a16"], "w8a8"),
    (["plan", "qwen3-8b", "--board", "rk3588-8g", "--quant", "nope"], "known schemes"),
    (["plan", "qwen3-8b", "--board", "rk3588-8g", "--ctx", "0"], "--ctx"),
    (["plan", "qwen3-8b", "--board", "rk3588-8g", "--batch", "-2"], "--batch"),
    (["plan", "acme/nothing-here", "--board", "rk3588-8g"], "not found"),
    (["boards", "show", "nope-board"], "unknown board"),
])
def test_bad_input_one_line_exit_2(args, needle):
    r = run(*args)
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0]


def test_a_bundle_is_not_planned_again_and_the_line_says_what_to_plan(tmp_path):
    """A bundle's directory (a manifest, no config.json): one line naming the recorded plan and the command."""
    bundle = tmp_path / "tiny-bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"schema": "edgeinfer.bundle/1", "plan": {}}))
    r = run("plan", str(bundle), "--board", "host")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code == 2 and r.stdout == "" and len(lines) == 1
    assert "is a bundle" in lines[0] and "edgeinfer plan MODEL --board BOARD" in lines[0]


def test_board_all_matrix_and_several_models():
    r = run("plan", "qwen3-0.6b", "qwen3-8b", "--board", "all", "--json")
    d = json.loads(r.stdout)
    assert d["kind"] == "edgeinfer.plan_matrix"
    packaged = len(list((Path(__file__).resolve().parents[1] / "boards").glob("*.yaml")))
    plugin_boards = len(registry().boards())  # the example plugin's example-cpu, in a dev install
    assert len(d["plans"]) == 2 * (packaged + plugin_boards + 1)  # every packaged board, plugin board and host
    assert r.exit_code == 1  # qwen3-8b does not fit the 4 GB boards
    cell = next(p for p in d["plans"]
                if p["board"]["name"] == "rk3588-4g" and p["model"]["name"] == "Qwen/Qwen3-0.6B")
    assert cell["fits"] is True and cell["options"]["quant"] == "fp16"  # rknn fp16: what deploy builds here


def test_boards_list_and_show():
    r = run("boards", "--json")
    names = {b["name"] for b in json.loads(r.stdout)["boards"]}
    assert r.exit_code == 0 and {"rk3588-16g", "atlas-300i-duo-96g", "core-ultra-288v", "host"} <= names
    r = run("boards", "show", "rk3588-16g", "--json")
    d = json.loads(r.stdout)
    assert d["npu_window_gib"]["value"] == 4 and "rknn-llm/issues/232" in d["npu_window_gib"]["source"]
    r = run("boards", "show", "rk3588-16g")
    assert r.exit_code == 0 and "bandwidth_gbps" in r.stdout


def test_user_board_file_on_cli(tmp_path):
    import yaml

    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "boards" / "rk3588-16g.yaml").read_text())
    d["name"] = "my-rk"
    p = tmp_path / "my-rk.yaml"
    p.write_text(yaml.safe_dump(d))
    r = run("plan", "qwen3-4b", "--board", str(p), "--quant", "w8a8", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["board"]["name"] == "my-rk"


def test_fast_path_imports_nothing_heavy():
    code = ("import sys; from edgeinfer.cli import main; sys.argv=['edgeinfer','plan','Qwen/Qwen3-8B','--board',"
            "'rk3588-16g','--quant','w8a8','--ctx','4096','--json']\n"
            "try:\n main()\nexcept SystemExit:\n pass\n"
            "heavy=[m for m in ('torch','onnxruntime','openvino','onnx','transformers') if m in sys.modules]\n"
            "print('HEAVY', heavy, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in r.stderr, r.stderr[-500:]
    assert json.loads(r.stdout)["fits"] is True
