"""The repository stands alone: every fact cites a public URL or a file (and anchor) of this repository."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from edgeinfer.planning.boards import load_boards

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("README.md", "Makefile", "pyproject.toml", "edgeinfer", "plugins", "boards", "docs", "tests", "bench",
           "examples")
# spelled in pieces so this file does not match itself
FORBIDDEN = re.compile("planner" + r"-data|\.\./" + "shared|" + "/work/" + "shared")
DOC_REF = re.compile(r"(?<![\w/.-])(docs/[\w.-]+\.md)(?:#([\w-]+))?")
REPO_REF = re.compile(r"(?<![\w/.-])((?:bench|edgeinfer)/[\w/.-]+\.(?:py|yaml|json))")
URL = re.compile(r"https?://\S+")


def _repo_text_files() -> list[Path]:
    out = []
    for entry in SCANNED:
        p = ROOT / entry
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
        for f in files:
            if any(part in {".venv", "__pycache__", ".git", "build"} or part.endswith(".egg-info")
                   for part in f.relative_to(ROOT).parts):
                continue
            try:
                out.append((f, f.read_text(encoding="utf-8")))
            except (UnicodeDecodeError, OSError):
                continue  # binary (PNG results, model files)
    return out


def _anchors(md: Path) -> set[str]:
    text = md.read_text(encoding="utf-8")
    ids = set(re.findall(r'<a id="([\w-]+)"', text))
    for heading in re.findall(r"^#+\s+(.+)$", text, flags=re.M):
        ids.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return ids


def _check_source(where: str, source: str) -> list[str]:
    """Problems with one `source`: it must hold a URL or a docs/ reference, and every docs/ reference resolves."""
    problems = []
    refs = DOC_REF.findall(source)
    files = REPO_REF.findall(source)
    if not URL.search(source) and not refs and not files:
        problems.append(f"{where}: source cites neither a URL nor a file of this repository: {source!r}")
    problems += [f"{where}: {f} does not exist" for f in files if not (ROOT / f).is_file()]
    for file, anchor in refs:
        path = ROOT / file
        if not path.is_file():
            problems.append(f"{where}: {file} does not exist")
        elif anchor and anchor not in _anchors(path):
            problems.append(f"{where}: {file} has no anchor #{anchor}")
    return problems


def test_no_file_cites_a_document_outside_the_repository() -> None:
    files = _repo_text_files()
    assert len(files) > 100  # the scan really walked the tree
    hits = [f"{f.relative_to(ROOT)}:{n}" for f, text in files
            for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]
    assert hits == []


def test_every_board_fact_cites_a_url_or_an_existing_doc_anchor() -> None:
    problems, checked = [], 0
    for board in load_boards().values():
        if board.origin != "packaged":
            continue
        data = board.model_dump()
        for key, value in data.items():
            if isinstance(value, dict) and "source" in value and "value" in value:
                problems += _check_source(f"{board.name}.{key}", value["source"])
                checked += 1
        for name, rt in board.runtimes.items():
            problems += _check_source(f"{board.name}.runtimes.{name}", rt.source)
            checked += 1
    assert checked > 100
    assert problems == []


def test_data_files_and_catalog_cite_urls_or_existing_doc_anchors() -> None:
    problems, checked = [], 0
    for f in sorted((ROOT / "edgeinfer" / "models" / "catalog").glob("*.json")):
        problems += _check_source(f.name, json.loads(f.read_text())["source"])
        checked += 1

    def walk(where: str, node: object) -> None:
        nonlocal problems, checked
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "source" and isinstance(v, str):
                    problems += _check_source(where, v)
                    checked += 1
                else:
                    walk(f"{where}.{k}", v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(f"{where}[{i}]", v)

    walk("runtimes.yaml", yaml.safe_load((ROOT / "edgeinfer" / "data" / "runtimes.yaml").read_text()))
    walk("speed_constants.json", json.loads((ROOT / "edgeinfer" / "data" / "speed_constants.json").read_text()))
    assert checked > 20
    assert problems == []


def test_every_docs_link_in_the_repository_resolves() -> None:
    problems = []
    for f, text in _repo_text_files():
        if f == Path(__file__).resolve():
            continue  # holds deliberately broken references
        for file, anchor in DOC_REF.findall(text):
            problems += _check_source(str(f.relative_to(ROOT)), f"https://x {file}#{anchor}" if anchor else
                                      f"https://x {file}")
    assert problems == []


@pytest.mark.parametrize("bad", ["a blog post", "docs/board-facts.md#no" + "-such-anchor", "docs/" + "missing.md",
                                 "bench/" + "missing.py"])
def test_the_source_check_rejects_unresolvable_sources(bad: str) -> None:
    assert _check_source("probe", bad)
