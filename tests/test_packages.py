"""What a bundle needs installed: the manifest's ``requires``, checked by ``verify``; a runtime package missing at
use is exit 3, kind ``package_missing``, naming the line that installs it (edgeinfer.contract.packages)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.contract import packages
from edgeinfer.errors import BackendUnavailableError
from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()

FAKE_METADATA = """Metadata-Version: 2.1
Name: fakenpu-plugin
Version: 0.0.1
Requires-Dist: numpy
Provides-Extra: base
Requires-Dist: fakenpu-runtime-absent>=1; extra == "base"
Provides-Extra: all
Requires-Dist: fakenpu-plugin[base]; extra == "all"
Requires-Dist: pluggy; extra == "all"
"""


@pytest.fixture
def fakenpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed distribution ``fakenpu-plugin`` whose extra ``base`` names a package that is not installed."""
    info = tmp_path / "fakenpu_plugin-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(FAKE_METADATA)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_missing_follows_extras_through_extras(fakenpu) -> None:
    assert packages.missing("fakenpu-plugin") == []  # the distribution is there; its base deps are pip's
    assert packages.missing("fakenpu-plugin[base]") == ["fakenpu-runtime-absent"]
    assert packages.missing("fakenpu-plugin[all]") == ["fakenpu-runtime-absent"]  # all names base
    assert packages.missing("FakeNPU_Plugin[all]") == ["fakenpu-runtime-absent"]  # names compare as pip's do
    assert packages.missing("edgeinfer-no-such-plugin[x]") == ["edgeinfer-no-such-plugin"]


def test_this_development_installation_has_every_extra_a_bundle_names() -> None:
    for req in ("edgeinfer[llm]", "edgeinfer[text]", "edgeinfer-openvino[decoders]", "edgeinfer-onnxruntime"):
        assert packages.missing(req) == [], req


def test_install_line_names_a_clone_folder_for_the_core_and_this_repositorys_plugins() -> None:
    assert packages.install_line("edgeinfer[llm,serve]") == "pip install '.[llm,serve]' (in a clone of edgeinfer)"
    assert (packages.install_line("edgeinfer-openvino[decoders]")
            == "pip install './plugins/openvino[decoders]' (in a clone of edgeinfer)")
    assert packages.install_line("rknn-toolkit-lite2") == "pip install 'rknn-toolkit-lite2'"
    assert packages.install_line("tvm-plugin[cuda]") == "pip install 'tvm-plugin[cuda]'"


def test_import_runtime_tells_a_missing_package_from_one_failing_to_import(tmp_path, monkeypatch) -> None:
    with pytest.raises(BackendUnavailableError) as e:
        packages.import_runtime("fakenpu_runtime_absent.api", "fakenpu-plugin[base]", "running a fakenpu bundle")
    assert (e.value.kind, e.value.exit_code) == ("package_missing", 3)
    assert e.value.one_line() == ("running a fakenpu bundle needs the Python package 'fakenpu_runtime_absent', "
                                  "which is not installed (install it: pip install 'fakenpu-plugin[base]')")
    (tmp_path / "fakenpu_broken.py").write_text("raise OSError('libfakenpu.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendUnavailableError) as e:
        packages.import_runtime("fakenpu_broken", "fakenpu-plugin[base]", "running a fakenpu bundle")
    assert e.value.kind == "backend_unavailable"
    assert "'fakenpu_broken' is installed but fails to import: libfakenpu.so" in e.value.message
    sys.modules.pop("fakenpu_broken", None)


@pytest.fixture(scope="module")
def host_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small ONNX model deployed for the host board (onnxruntime)."""
    from edgeinfer.deploy.encoder import deploy
    from edgeinfer.testing.models import mlp

    tmp = tmp_path_factory.mktemp("requires")
    m = mlp(tmp)
    np.save(tmp / "x.npy", m.feeds["x"])
    deploy(m.path, "host", tmp / "bundle")
    return tmp / "bundle"


def test_deploy_records_what_the_bundle_runs_with_and_verify_checks_it(host_bundle: Path) -> None:
    assert json.loads((host_bundle / "manifest.json").read_text())["requires"] == ["edgeinfer",
                                                                                   "edgeinfer-onnxruntime"]
    proc = cli("verify", str(host_bundle), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["installed"] is True and report["refused"] == []
    assert [(r["requirement"], r["installed"]) for r in report["requires"]] == [("edgeinfer", True),
                                                                                ("edgeinfer-onnxruntime", True)]
    assert "runs with edgeinfer-onnxruntime: installed" in cli("verify", str(host_bundle)).stdout


def test_verify_says_what_this_installation_lacks(host_bundle: Path, tmp_path: Path, fakenpu) -> None:
    import shutil

    from edgeinfer.model import bundle as bundle_mod

    b = shutil.copytree(host_bundle, tmp_path / "b")
    manifest = bundle_mod.read_manifest(b)
    manifest.requires = [*manifest.requires, "fakenpu-plugin[all]"]
    bundle_mod.write(b, manifest)
    proc = cli("verify", str(b), "--json")
    assert proc.returncode == 3
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["installed"] is False  # the files are intact; a package is missing
    assert report["requires"][-1] == {"requirement": "fakenpu-plugin[all]", "installed": False,
                                      "missing": ["fakenpu-runtime-absent"],
                                      "install": "pip install 'fakenpu-plugin[all]'"}
    text = cli("verify", str(b))
    assert text.returncode == 3
    assert ("runs with fakenpu-plugin[all]: not installed (fakenpu-runtime-absent missing); pip install "
            "'fakenpu-plugin[all]'") in text.stdout
    assert "error: this installation cannot run bundle" in text.stderr


def test_verify_says_which_artifact_the_installed_backend_refuses(host_bundle: Path, tmp_path: Path) -> None:
    """An artifact converted by a later onnxruntime release than this one: intact, but load would refuse it."""
    import shutil

    from edgeinfer.contract import stamp
    from edgeinfer.model import bundle as bundle_mod

    b = shutil.copytree(host_bundle, tmp_path / "b")
    manifest = bundle_mod.read_manifest(b)
    (artifact,) = manifest.artifacts
    p = stamp.stamp_path(b / artifact)
    data = json.loads(p.read_text())
    installed = data["versions"]["toolkit"]
    data["versions"]["toolkit"] = "onnxruntime 99.1.0"
    p.write_text(json.dumps(data))
    bundle_mod.write(b, manifest)  # sealed again: the bundle is intact, only its stamp is from elsewhere
    proc = cli("verify", str(b), "--json")
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["installed"] is False
    assert all(r["installed"] for r in report["requires"])
    why = (f"{artifact} was built with onnxruntime 99.1.0, newer than the installed {installed}; upgrade to "
           "onnxruntime 99.1.0 or later, or convert the model again here")
    assert report["refused"] == [{"artifact": artifact, "reason": why}]
    text = cli("verify", str(b))
    assert text.returncode == 3 and f"refused here: {why}" in text.stdout
    assert text.stderr.strip() == f"error: this installation cannot run bundle {b}: {why}"
    data["versions"]["toolkit"] = "onnxruntime 1.16.3"  # an older release's: loads
    p.write_text(json.dumps(data))
    bundle_mod.write(b, manifest)
    assert json.loads(cli("verify", str(b), "--json").stdout)["refused"] == []
