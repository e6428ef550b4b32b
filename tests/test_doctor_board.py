"""`edgeinfer doctor --board B`: exit 3 unless B's backend imports and its probe finds it usable, 2 for an unknown
board; hints tell a plugin that is not installed from one that fails to import, and name its distribution."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import make_plugin_dist

from edgeinfer.contract import registry as plugins
from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()
BOARDS = Path(__file__).resolve().parents[1] / "boards"

MISSING_SDK = """
import tvm_runtime_absent_here  # the vendor SDK this plugin needs, not installed
"""
BROKEN_SDK = """
raise ImportError("libtvm.so: cannot open shared object file")
"""


def _board(tmp_path: Path, backend: str) -> Path:
    """A copy of an Intel board profile whose backend is ``backend``."""
    data = yaml.safe_load((BOARDS / "core-ultra-155h.yaml").read_text())
    data.update(name=f"box-{backend}", backend=backend)
    path = tmp_path / f"box-{backend}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a throwaway plugin distribution ``edgeinfer-tvm`` (entry point ``tvm``) in this process."""
    def install(src: str) -> None:
        make_plugin_dist(tmp_path, "edgeinfer-tvm", "tvm", src)
        monkeypatch.syspath_prepend(str(tmp_path))
        plugins.reset()

    yield install
    sys.modules.pop("tvm_plugin_mod", None)
    plugins.reset()


def test_doctor_board_checks_that_boards_backend_only() -> None:
    proc = cli("doctor", "--board", "core-ultra-155h", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["board"], report["backend"], report["usable"]) == ("core-ultra-155h", "openvino", ["openvino"])
    assert [b["name"] for b in report["backends"]] == ["openvino"]
    assert report["missing"] is None
    text = cli("doctor", "--board", "core-ultra-155h")
    assert text.returncode == 0
    assert "board core-ultra-155h: backend openvino is usable" in " ".join(text.stdout.split())


def test_doctor_board_unknown_board_is_a_usage_error() -> None:
    proc = cli("doctor", "--board", "no-such-board", "--json")
    assert proc.returncode == 2
    assert "unknown board 'no-such-board'" in proc.stderr


def test_doctor_board_whose_plugin_is_left_out_is_exit_3() -> None:
    plugins.reset()  # the registry reads EDGEINFER_PLUGINS when it is created
    try:
        proc = cli("doctor", "--board", "core-ultra-155h", "--json", env={"EDGEINFER_PLUGINS": "onnxruntime"})
    finally:
        plugins.reset()
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["usable"] == [] and report["backends"] == []
    assert "EDGEINFER_PLUGINS leaves it out" in report["missing"]["fix"]


def test_doctor_board_with_no_plugin_for_its_backend_says_not_installed(tmp_path: Path) -> None:
    proc = cli("doctor", "--board", str(_board(tmp_path, "nosuchnpu")), "--json")
    assert proc.returncode == 3, proc.stderr
    missing = json.loads(proc.stdout)["missing"]
    assert missing["message"] == "backend 'nosuchnpu' is not installed (no plugin provides it)"
    assert "registers backend 'nosuchnpu'" in missing["fix"]


def test_doctor_board_plugin_missing_its_sdk_names_module_and_distribution(tmp_path: Path, third_party) -> None:
    third_party(MISSING_SDK)
    proc = cli("doctor", "--board", str(_board(tmp_path, "tvm")), "--json")
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["missing"]["message"] == ("backend 'tvm': its plugin (distribution edgeinfer-tvm 0.0.1) is "
                                            "installed but fails to import: module 'tvm_runtime_absent_here' is "
                                            "not installed")
    fix = report["missing"]["fix"]
    assert "module 'tvm_runtime_absent_here' (a dependency of edgeinfer-tvm)" in fix
    assert "pip install --force-reinstall edgeinfer-tvm" in fix and "./plugins" not in fix
    assert [f["distribution"] for f in report["failed_plugins"]] == ["edgeinfer-tvm"]
    text = " ".join(cli("doctor", "--board", str(_board(tmp_path, "tvm"))).stdout.split())
    assert "fix: install the package that provides module 'tvm_runtime_absent_here'" in text
    assert "backend tvm is not usable here" in text


def test_doctor_plugin_failing_to_import_is_told_apart_and_its_distribution_named(tmp_path: Path,
                                                                                   third_party) -> None:
    third_party(BROKEN_SDK)
    board = cli("doctor", "--board", str(_board(tmp_path, "tvm")), "--json")
    assert board.returncode == 3
    missing = json.loads(board.stdout)["missing"]
    assert "is installed but fails to load (import failed: ImportError: libtvm.so" in missing["message"]
    assert missing["fix"].startswith("fix what the error names, or reinstall edgeinfer-tvm")
    plugins.reset()  # the full doctor, with the reference backend only besides (every probe would take seconds)
    everything = cli("doctor", "--json", env={"EDGEINFER_PLUGINS": "tvm,onnxruntime"})
    assert everything.returncode == 0  # the other backend works
    failed = {f["plugin"]: f for f in json.loads(everything.stdout)["failed_plugins"]}
    assert failed["tvm"]["fix"] == ("fix what the error names, or reinstall edgeinfer-tvm (pip install "
                                    "--force-reinstall edgeinfer-tvm, from where you got it)")


def test_repair_hint_of_a_plugin_of_this_repository_adds_its_folder() -> None:
    info = plugins.PluginInfo("openvino", "edgeinfer-openvino", "0.1.0", "import failed: ImportError: x")
    assert plugins.repair_hint(info) == ("fix what the error names, or reinstall edgeinfer-openvino; from a clone "
                                         "of edgeinfer: pip install --force-reinstall ./plugins/openvino")


def test_using_a_backend_whose_plugin_fails_to_import_names_its_distribution(third_party) -> None:
    third_party(MISSING_SDK)
    from edgeinfer.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError) as e:
        plugins.get_backend("tvm")
    assert e.value.message == ("backend 'tvm': its plugin (distribution edgeinfer-tvm 0.0.1) is installed but "
                               "fails to import: module 'tvm_runtime_absent_here' is not installed")
    assert e.value.hint.startswith("install the package that provides module 'tvm_runtime_absent_here' (a "
                                   "dependency of edgeinfer-tvm)")
