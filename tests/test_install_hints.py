"""Install hints name what a user can actually install: plugin folders of this repository, extras that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from test_sources import _repo_text_files

from edgeinfer.contract.registry import BUNDLED, get_backend, install_hint, reset
from edgeinfer.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_PATH = re.compile(r"""pip install ['"]?\./plugins/(\w+)(?:\[(\w+)\])?""")
CORE_EXTRA = re.compile(r"""pip install ['"]?(?:\.|edgeinfer)\[([\w,]+)\]""")  # '.[llm,serve]' too


def _extras(pyproject: Path) -> set[str]:
    return set(tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {}))


@pytest.mark.parametrize("name", BUNDLED)
def test_hint_for_a_missing_bundled_backend_names_its_plugin_folder(name: str, monkeypatch) -> None:
    monkeypatch.delenv("EDGEINFER_PLUGINS", raising=False)
    hint = install_hint(name)
    assert f"pip install ./plugins/{name}" in hint
    assert (ROOT / "plugins" / name / "pyproject.toml").is_file()


def test_unknown_backend_error_points_at_edgeinfer_plugins_when_it_hides_the_plugin(monkeypatch) -> None:
    monkeypatch.setenv("EDGEINFER_PLUGINS", "onnxruntime")
    reset()
    try:
        with pytest.raises(BackendUnavailableError) as e:
            get_backend("openvino")
        assert "EDGEINFER_PLUGINS" in e.value.hint and "add openvino" in e.value.hint
    finally:
        monkeypatch.delenv("EDGEINFER_PLUGINS")
        reset()


def test_every_install_command_in_code_and_docs_names_an_existing_folder_and_extra() -> None:
    """`pip install ./plugins/X[extra]` and `pip install '.[extra]'`: X exists and declares the extra;
    nothing tells users to install an `edgeinfer-*` distribution from an index that does not have it."""
    seen, problems = 0, []
    for f, text in _repo_text_files():
        if f == Path(__file__).resolve():
            continue
        where = f.relative_to(ROOT)
        if re.search(r"pip install ['\"]?edgeinfer-", text):
            problems.append(f"{where}: names an edgeinfer-* distribution no index has")
        for plugin, extra in PLUGIN_PATH.findall(text):
            seen += 1
            pyproject = ROOT / "plugins" / plugin / "pyproject.toml"
            if not pyproject.is_file():
                problems.append(f"{where}: ./plugins/{plugin} does not exist")
            elif extra and extra not in _extras(pyproject):
                problems.append(f"{where}: ./plugins/{plugin} has no extra [{extra}]")
        for extra in ",".join(CORE_EXTRA.findall(text)).split(","):
            if not extra:
                continue
            seen += 1
            if extra not in _extras(ROOT / "pyproject.toml"):
                problems.append(f"{where}: edgeinfer has no extra [{extra}]")
    assert seen >= 10
    assert problems == []
