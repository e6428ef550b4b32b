"""The layout's rules (docs/architecture.md): each room imports only rooms to its left, no import cycle
(the root package included; imports inside functions counted), plugins import only the contract, the
errors and the testing kit, no private name is imported from another module, no plugin is named in core
code, no module (core or plugin) is over ~500 lines. Each rule has a test that feeds it a violation."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

import edgeinfer

PKG = Path(edgeinfer.__file__).resolve().parent
REPO = PKG.parent
MAX_LINES = 500
# vendor and runtime names a core module must not know; data files (board YAML) may name them
# (a hyphenated name is an upstream project cited as a source, e.g. "rknn-llm #232")
PLUGIN_NAMES = re.compile(r"\b(rknn|openvino|ascend|torch_npu|onnxruntime)\b(?!-)", re.I)
# the one core module that names backends, as data: the reference backends and the plugins in this repository
NAMING_ALLOWED = {"contract/names.py"}

# The rooms, left to right (docs/architecture.md): a module imports only its own room and rooms to its left.
# Leaves (errors, files, progress, telemetry, version) are left of every room and import only leaves; the
# root package (the public API: edgeinfer.load, edgeinfer.plan ...) sits under cli; testing may import anything.
LEAVES = ("errors", "files", "progress", "telemetry", "version")
ROOMS = ("contract", "planning", "model", "run", "deploy", "serve", "fleet", "", "cli", "testing")
# what plugin code (plugins/*/edgeinfer_*, examples/*/edgeinfer_*) may import of the core
PLUGIN_ALLOWED = ("edgeinfer.contract", "edgeinfer.errors", "edgeinfer.testing")


def plugin_packages() -> list[Path]:
    return sorted([*REPO.glob("plugins/*/edgeinfer_*"), *REPO.glob("examples/*/edgeinfer_*")])


def _module_name(path: Path, top: Path) -> str:
    parts = list(path.relative_to(top.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "testing" not in p.relative_to(PKG).parts)


def _plugin_files() -> list[Path]:
    return sorted(p for pkg in plugin_packages() for p in pkg.rglob("*.py"))


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


def imports(path: Path, top: Path, runtime_only: bool = True) -> Iterator[tuple[int, str, list[str]]]:
    """(line, absolute module, names) of every import in ``path``, a module of the package ``top``:
    ``import a.b`` gives ("a.b", []), ``from .x import y`` gives ("<package>.x", ["y"])."""
    mod = _module_name(path, top)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in (_runtime_nodes(tree) if runtime_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base, [a.name for a in node.names]


def import_graph(pkg: Path = PKG) -> dict[str, dict[str, int]]:
    """module -> {the modules of ``pkg`` it imports anywhere in its body: line}. ``from pkg import mod``
    counts as an import of ``pkg.mod`` when that is a module, else of ``pkg`` (``from edgeinfer import
    __version__`` is an edge to the root package). Only explicit imports are edges: that importing
    ``pkg.sub`` runs ``pkg/__init__`` first is the import system's order, not a dependency."""
    files = {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for mod, path in files.items():
        deps: dict[str, int] = {}
        for line, base, names in imports(path, pkg):
            for target in ([f"{base}.{n}" if f"{base}.{n}" in files else base for n in names] or [base]):
                if target in files and target != mod:
                    deps.setdefault(target, line)
        graph[mod] = deps
    return graph


def find_cycle(graph) -> list[str] | None:
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


def room(module: str) -> tuple[int, str]:
    """(rank, name) of a core module's room: leaves -1, then ROOMS left to right ("" is the root package)."""
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else ""
    if first in LEAVES:
        return -1, first
    if first not in ROOMS:
        raise AssertionError(f"{module} is in no room: add edgeinfer/{first} to ROOMS (and docs/architecture.md)")
    return ROOMS.index(first), first or "edgeinfer (root)"


def room_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import of a room to the importer's right (a leaf importing any room is one)."""
    out = []
    for mod, deps in sorted(graph.items()):
        (rank, name) = room(mod)
        for dep, line in sorted(deps.items()):
            dep_rank, dep_name = room(dep)
            if dep_rank > rank or (rank == -1 and dep_rank != -1):
                out.append(f"{mod}:{line} ({name}) imports {dep} ({dep_name}), a room to its right")
    return out


def plugin_import_violations(path: Path, top: Path, core: set[str]) -> list[str]:
    """Imports of ``path`` (plugin code in package ``top``) of an edgeinfer module the plugin may not use;
    type-only imports count: they name the module as much as a run-time one."""
    out = []
    for line, base, names in imports(path, top, runtime_only=False):
        if base != "edgeinfer" and not base.startswith("edgeinfer."):
            continue
        targets = [f"{base}.{n}" if f"{base}.{n}" in core else base for n in names] or [base]
        for t in targets:
            if not any(t == a or t.startswith(a + ".") for a in PLUGIN_ALLOWED):
                what = f"from {base} import {', '.join(names)}" if names else f"import {base}"
                out.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}: {what}")
                break
    return out


def private_imports(path: Path, top: Path) -> list[str]:
    """``from m import _name`` in ``path`` where ``m`` is another module (a private name is its module's own)."""
    mod = _module_name(path, top)
    return [f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}: from {base} import {n}"
            for line, base, names in imports(path, top, runtime_only=False)
            for n in names if n.startswith("_") and not n.endswith("__") and base != mod]


def _core_module_names() -> set[str]:
    return {_module_name(p, PKG) for p in PKG.rglob("*.py")}


# --- each rule can fail ----------------------------------------------------------------------------------


def test_find_cycle_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_sees_function_level_imports() -> None:
    g = import_graph()
    # planning.planner imports the paging cost model inside a function
    assert "edgeinfer.planning.paging" in g["edgeinfer.planning.planner"]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        f = tmp_path / "edgeinfer" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path / "edgeinfer"


def test_a_cycle_through_the_root_package_is_seen(tmp_path: Path) -> None:
    # the root's API imports a room in a function; that room reads the version from the root: a cycle
    pkg = _package(tmp_path, {
        "__init__.py": "__version__ = '1'\ndef load():\n    from edgeinfer.run import loading\n",
        "run/__init__.py": "",
        "run/loading.py": "from edgeinfer.contract import stamp\n",
        "contract/__init__.py": "from edgeinfer.contract import stamp\n",
        "contract/stamp.py": "def write():\n    from edgeinfer import __version__\n",
    })
    g = import_graph(pkg)
    assert g["edgeinfer.contract.stamp"] == {"edgeinfer": 2}
    # importing edgeinfer.contract runs edgeinfer/__init__ first: the import system's order, no edge
    assert "edgeinfer" not in g["edgeinfer.run.loading"]
    assert find_cycle(g) == ["edgeinfer", "edgeinfer.run.loading", "edgeinfer.contract.stamp", "edgeinfer"]


def test_room_order_reports_an_import_to_the_right() -> None:
    graph = {"edgeinfer.contract.backend": {"edgeinfer.planning.quant": 31, "edgeinfer.errors": 30},
             "edgeinfer.planning.paging": {"edgeinfer.run.schedule": 13},
             "edgeinfer.serve.app": {"edgeinfer.fleet.router": 5, "edgeinfer.run.loading": 6},
             "edgeinfer.progress": {"edgeinfer.contract.names": 14},
             "edgeinfer.cli.plan": {"edgeinfer": 3, "edgeinfer.planning.matrix": 4}}
    assert room_violations(graph) == [
        "edgeinfer.contract.backend:31 (contract) imports edgeinfer.planning.quant (planning), a room to its right",
        "edgeinfer.planning.paging:13 (planning) imports edgeinfer.run.schedule (run), a room to its right",
        "edgeinfer.progress:14 (progress) imports edgeinfer.contract.names (contract), a room to its right",
        "edgeinfer.serve.app:5 (serve) imports edgeinfer.fleet.router (fleet), a room to its right",
    ]


def test_plugin_import_rule_reports_core_internals(tmp_path: Path) -> None:
    top = tmp_path / "edgeinfer_x"
    top.mkdir()
    (top / "__init__.py").write_text("")
    f = top / "backend.py"
    f.write_text("from edgeinfer import hookimpl\nfrom edgeinfer import errors\n"
                 "from edgeinfer.contract import Backend\nfrom edgeinfer.contract.schedule import Schedule\n"
                 "from edgeinfer.testing.llm import model_dir\nfrom . import device\nimport edgeinfer_x.device\n"
                 "def f():\n    from edgeinfer.planning import planner\n    import edgeinfer.model.cache\n")
    assert [v.split(":", 2)[2] for v in plugin_import_violations(f, top, _core_module_names())] == [
        " from edgeinfer import hookimpl", " from edgeinfer.planning import planner", " import edgeinfer.model.cache"]


def test_private_import_rule_reports_another_modules_private_name(tmp_path: Path) -> None:
    top = tmp_path / "edgeinfer_x"
    top.mkdir()
    (top / "__init__.py").write_text("")
    f = top / "decoder.py"
    f.write_text("from edgeinfer.run.schedule import _Schedule, simulate\nfrom .backend import INT8, _torchao\n"
                 "from edgeinfer.version import __version__\nfrom edgeinfer import telemetry as _telemetry\n")
    assert [v.split(":", 2)[2] for v in private_imports(f, top)] == [
        " from edgeinfer.run.schedule import _Schedule", " from edgeinfer_x.backend import _torchao"]


def test_size_rule_reports_a_long_module(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("x = 1\n" * MAX_LINES)
    assert _too_long(f) is None
    f.write_text("x = 1\n" * (MAX_LINES + 1))
    assert _too_long(f) == f"{f} has {MAX_LINES + 1} lines (limit {MAX_LINES}); split it"


# --- the rules on this repository ------------------------------------------------------------------------


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_rooms_import_only_rooms_to_their_left() -> None:
    bad = room_violations(import_graph())
    assert not bad, "imports against the room order (docs/architecture.md):\n" + "\n".join(bad)


def test_plugins_import_only_the_contract_errors_and_testing() -> None:
    core = _core_module_names()
    assert plugin_packages(), "no plugin packages found"
    bad = [v for pkg in plugin_packages() for f in sorted(pkg.rglob("*.py"))
           for v in plugin_import_violations(f, pkg, core)]
    assert not bad, f"plugin code imports core internals (only {', '.join(PLUGIN_ALLOWED)}):\n" + "\n".join(bad)


def test_no_private_name_imported_across_modules() -> None:
    bad = [v for f in sorted(PKG.rglob("*.py")) for v in private_imports(f, PKG)]
    bad += [v for pkg in plugin_packages() for f in sorted(pkg.rglob("*.py")) for v in private_imports(f, pkg)]
    assert not bad, "private names imported from another module (make them public or move the code):\n" + \
        "\n".join(bad)


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


def _too_long(path: Path) -> str | None:
    n = len(path.read_text(encoding="utf-8").splitlines())
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"{shown} has {n} lines (limit {MAX_LINES}); split it" if n > MAX_LINES else None


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_core_module_is_small(path: Path) -> None:
    assert _too_long(path) is None, _too_long(path)


@pytest.mark.parametrize("path", _plugin_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_plugin_module_is_small(path: Path) -> None:
    assert _too_long(path) is None, _too_long(path)
