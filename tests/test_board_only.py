"""``deploy --board-only``'s step on a finished bundle (``edgeinfer.deploy.outdir.leave_out_simulation``): what a
backend's ``simulation_files`` names leaves the bundle and the manifest names it (deploy then seals the rest); a
backend that names a file the board runs, or one outside the bundle, removes nothing. The end-to-end deploys are in
tests/test_deploy.py (MiniLM, RKNN simulator) and plugins/rknn/tests/test_decoder.py (a decoder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgeinfer.deploy.outdir import leave_out_simulation
from edgeinfer.model import bundle as bundle_mod


class NamesFiles:
    """A backend's ``simulation_files`` answer, fixed: only that method is asked."""

    name = "names-files"

    def __init__(self, *rel: str, outside: Path | None = None):
        self.rel, self.outside = rel, outside

    def simulation_files(self, bundle: Path) -> list[Path]:
        return [bundle / r for r in self.rel] + ([self.outside] if self.outside else [])


@pytest.fixture
def bundle(tiny_qwen3_host_bundle, tmp_path) -> Path:
    b = tmp_path / "b"
    shutil.copytree(tiny_qwen3_host_bundle, b)
    (b / "decoder" / "extra.src.onnx").write_bytes(b"only a simulator reads this")
    bundle_mod.write(b, bundle_mod.Bundle.open(b).manifest)
    return b


def test_named_files_leave_the_bundle_which_stays_sealed(bundle):
    manifest = bundle_mod.Bundle.open(bundle).manifest
    leave_out_simulation(bundle, NamesFiles("decoder/extra.src.onnx"), manifest)
    bundle_mod.write(bundle, manifest)  # as deploy does next: the manifest seals what is left
    assert not (bundle / "decoder" / "extra.src.onnx").exists()
    on_disk = bundle_mod.Bundle.open(bundle, verify="full").manifest
    assert on_disk.left_out == ["decoder/extra.src.onnx"] and "decoder/extra.src.onnx" not in on_disk.files
    report = bundle_mod.verify(bundle)
    assert report["ok"] and report["left_out"] == ["decoder/extra.src.onnx"]


@pytest.mark.parametrize("what", ["artifact", "manifest", "outside"])
def test_a_file_the_board_runs_or_one_outside_is_refused_and_nothing_removed(bundle, tmp_path, what):
    manifest = bundle_mod.Bundle.open(bundle).manifest
    outside = tmp_path / "elsewhere.onnx"
    outside.write_bytes(b"x")
    backend = {"artifact": NamesFiles("decoder/extra.src.onnx", manifest.artifacts[0]),
               "manifest": NamesFiles("manifest.json"), "outside": NamesFiles(outside=outside)}[what]
    before = sorted(p.relative_to(bundle) for p in bundle.rglob("*"))
    with pytest.raises(ValueError, match="names-files names"):
        leave_out_simulation(bundle, backend, manifest)
    assert sorted(p.relative_to(bundle) for p in bundle.rglob("*")) == before and outside.exists()
    assert bundle_mod.verify(bundle)["ok"]
