"""Plugin discovery through real entry points (throwaway distributions on PYTHONPATH)."""

import json
import os

import pytest
from helpers import edgeinfer, make_plugin_dist

BROKEN = """
raise ImportError("libmynpu.so: cannot open shared object file")
"""

MISSING_METHOD = """
from edgeinfer import hookimpl
from edgeinfer.contract.backend import Backend

class HalfBackend(Backend):
    name = "half"
    def probe(self):
        pass
    def convert(self, model, scheme, calibration, out, **options):
        pass

@hookimpl
def register_backends(register):
    register(HalfBackend)
"""

HOOK_RAISES = """
from edgeinfer import hookimpl

@hookimpl
def register_backends(register):
    raise RuntimeError("vendor SDK licence check failed")
"""

ADDS_COMMAND = """
import click
from edgeinfer import hookimpl

@hookimpl
def register_commands(cli):
    @cli.command()
    def hello():
        click.echo("hello from a plugin")
"""


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> tuple[dict, str]:
    """One CLI start for the three faulty plugins' cases: ``backends --json`` and ``backends`` with a plugin whose
    import raises, one whose backend lacks a method and one whose hook raises, all installed at once."""
    roots = []
    for dist, name, src in (("edgeinfer-broken", "broken", BROKEN), ("edgeinfer-half", "half", MISSING_METHOD),
                            ("edgeinfer-raises", "raises", HOOK_RAISES)):
        roots.append(tmp_path_factory.mktemp(name))
        make_plugin_dist(roots[-1], dist, name, src)
    env = {"PYTHONPATH": os.pathsep.join([*map(str, roots), os.environ.get("PYTHONPATH", "")])}
    proc, human = edgeinfer("backends", "--json", env=env), edgeinfer("backends", env=env)
    assert proc.returncode == 0, proc.stderr
    assert human.returncode == 0, human.stderr
    return json.loads(proc.stdout), human.stdout


def test_plugin_whose_import_raises_is_listed_and_others_still_work(faulty):
    report, human = faulty
    failed = {f["plugin"]: f for f in report["failed_plugins"]}
    assert "libmynpu.so" in failed["broken"]["error"]
    assert failed["broken"]["distribution"] == "edgeinfer-broken"
    assert "onnxruntime" in {b["name"] for b in report["backends"]}
    assert "broken" in human


def test_backend_missing_a_required_method_fails_registration_by_name(faulty):
    report, _ = faulty
    failed = {f["plugin"]: f["error"] for f in report["failed_plugins"]}
    assert "half" in failed and "`open`" in failed["half"]
    assert "half" not in {b["name"] for b in report["backends"]}


def test_hook_that_raises_is_reported_against_its_plugin_and_others_register(faulty):
    report, _ = faulty
    failed = {f["plugin"]: f["error"] for f in report["failed_plugins"]}
    assert failed["raises"] == "register_backends failed: RuntimeError: vendor SDK licence check failed"
    assert {"onnxruntime", "openvino", "example"} <= {b["name"] for b in report["backends"]}


def test_edgeinfer_plugins_restricts_what_loads(tmp_path):
    env = make_plugin_dist(tmp_path, "edgeinfer-broken", "broken", BROKEN)
    only = json.loads(edgeinfer("backends", "--json", env=dict(env, EDGEINFER_PLUGINS="onnxruntime")).stdout)
    assert [b["name"] for b in only["backends"]] == ["onnxruntime"]
    assert only["failed_plugins"] == []
    none = json.loads(edgeinfer("backends", "--json", env={"EDGEINFER_PLUGINS": ""}).stdout)
    assert none == {"backends": [], "failed_plugins": []}


def test_plugin_can_add_a_command(tmp_path):
    env = make_plugin_dist(tmp_path, "edgeinfer-hello", "hello", ADDS_COMMAND)
    proc = edgeinfer("hello", env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "hello from a plugin"


def test_unknown_backend_lists_the_known_ones():
    proc = edgeinfer("run", "x.onnx", "--backend", "nosuch")
    # the model file is checked first: a missing file is exit 2
    assert proc.returncode == 2 and proc.stderr.strip() == "error: model file not found: x.onnx", proc.stderr
    import edgeinfer as ei
    from edgeinfer.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="unknown backend 'nosuch'; available: .*onnxruntime"):
        ei.backend("nosuch")


def test_doctor_exit_codes():
    ok = edgeinfer("doctor", "--json")
    assert ok.returncode == 0 and "onnxruntime" in json.loads(ok.stdout)["usable"]
    nothing = edgeinfer("doctor", "--json", env={"EDGEINFER_PLUGINS": ""})
    assert nothing.returncode == 3 and json.loads(nothing.stdout)["usable"] == []
