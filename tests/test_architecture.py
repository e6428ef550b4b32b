"""The layout's rules (docs/architecture.md): no import cycle among edgeinfer's modules (imports
inside functions included), no plugin named in core code, no core module over ~500 lines."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import edgeinfer

PKG = Path(edgeinfer.__file__).resolve().parent
MAX_LINES = 500
# vendor and runtime names a core module must not know; data files (board YAML) may name them
# (a hyphenated name is an upstream project cited as a source, e.g. "rknn-llm #232")
PLUGIN_NAMES = re.compile(r"\b(rknn|openvino|ascend|torch_npu|onnxruntime)\b(?!-)", re.I)
# the one core module that names backends, as data: the reference backends and the plugins in this repository
NAMING_ALLOWED = {"contract/names.py"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "testing" not in p.relative_to(PKG).parts)


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (annotations only, never imported at run time)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def import_graph() -> dict[str, set[str]]:
    """module -> the edgeinfer modules it imports anywhere in its body (``from pkg import mod``
    counts as an import of ``pkg.mod`` when that is a module, else of ``pkg``)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    deps.add(sub if sub in files else base)
        graph[mod] = {d for d in deps if d in files and d != mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def _ignoring_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # a package __init__ that re-exports its submodules is not a cycle: importing `pkg.sub` runs
    # `pkg/__init__` first, which is the import system's order, not a design dependency
    return {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}


def test_find_cycle_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_sees_function_level_imports() -> None:
    g = import_graph()
    # planning.planner imports the paging cost model inside a function
    assert "edgeinfer.planning.paging" in g["edgeinfer.planning.planner"]


def test_no_import_cycle() -> None:
    cycle = find_cycle(_ignoring_package_inits(import_graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _code_tokens(path: Path):
    """(line, text) of every name and string in ``path`` except comments and docstrings."""
    text = path.read_text(encoding="utf-8")
    docs: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                    and isinstance(first.value.value, str):
                docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.NAME, tokenize.STRING) and tok.start[0] not in docs:
            yield tok.start[0], tok.string


def test_code_tokens_skip_comments_and_docstrings(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('"""doc onnxruntime"""\n# rknn\nx = "openvino"  # ascend\n')
    assert [s for _, s in _code_tokens(f) if PLUGIN_NAMES.search(s)] == ['"openvino"']


def test_core_names_no_plugin() -> None:
    hits = []
    for p in _core_files():
        if p.relative_to(PKG).as_posix() in NAMING_ALLOWED:
            continue
        for line, s in _code_tokens(p):
            if PLUGIN_NAMES.search(s):
                hits.append(f"{p.relative_to(PKG.parent)}:{line}: {s}")
    assert not hits, "plugin names in core code:\n" + "\n".join(hits)


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_core_module_is_small(path: Path) -> None:
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(PKG.parent)} has {n} lines (limit {MAX_LINES}); split it"
