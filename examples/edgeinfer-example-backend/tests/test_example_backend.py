import json
import subprocess
import sys

from edgeinfer.testing import BackendConformance


class TestExampleConformance(BackendConformance):
    backend_name = "example"


def test_listed_by_edgeinfer_backends():
    out = subprocess.run(
        [sys.executable, "-m", "edgeinfer.cli", "backends", "--json"], capture_output=True, text=True, check=True
    )
    rows = {b["name"]: b for b in json.loads(out.stdout)["backends"]}
    assert rows["example"]["distribution"] == "edgeinfer-example-backend"
    assert rows["example"]["available"] is True
