"""A decoder bundle on an installation without GenAI (a board's encoder line): exit 3, kind package_missing,
naming the extra that installs it, where it used to be `No module named 'openvino_genai'` with no hint."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.errors import BackendUnavailableError
from edgeinfer.testing.cli import run_cli

LINE = "pip install './plugins/openvino[decoders]'"


@pytest.mark.parametrize("absent", ["openvino_genai", "openvino_tokenizers"])
def test_decoder_bundle_without_genai_names_the_decoders_extra(tiny_qwen3_openvino_bundle: Path, absent: str,
                                                               capfd, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, absent, None)  # what `import` finds where the package is not installed
    proc = run_cli(capfd, "generate", str(tiny_qwen3_openvino_bundle), "--prompt", "hi", "--max-new-tokens", "2")
    assert proc.returncode == 3, proc.stderr
    assert f"needs the Python package '{absent}', which is not installed" in proc.stderr
    assert LINE in proc.stderr
    with pytest.raises(BackendUnavailableError) as e:
        edgeinfer.load(tiny_qwen3_openvino_bundle)
    assert e.value.kind == "package_missing" and LINE in e.value.hint


def test_decoder_bundle_records_the_extras_it_runs_with(tiny_qwen3_openvino_bundle: Path) -> None:
    import json

    manifest = json.loads((tiny_qwen3_openvino_bundle / "manifest.json").read_text())
    assert manifest["requires"] == ["edgeinfer[llm]", "edgeinfer-openvino[decoders]"]
