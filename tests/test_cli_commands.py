"""The CLI's command set: every core command is registered without a guard, so a broken import
fails loudly instead of making a command vanish; an unknown command names plugins that failed."""

from __future__ import annotations

import subprocess
import sys

from edgeinfer.contract.registry import PluginInfo

CORE = {"backends", "doctor", "run", "deploy", "golden", "verify", "bench", "plan", "boards", "generate", "chat",
        "serve", "ray-resources", "ray-node", "cache"}

# makes `import edgeinfer.cli.serve` fail as if the [serve] extra were missing underneath it
_BREAK_SERVE = """
import importlib.abc, sys
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "edgeinfer.cli.serve":
            raise ModuleNotFoundError("No module named 'starlette'", name="starlette")
sys.meta_path.insert(0, Broken())
"""


def test_every_core_command_is_there_before_plugins_attach():
    """Listed and resolved to its click command (imported on first use: `plan` does not import the others)."""
    import click

    from edgeinfer import cli

    ctx = click.Context(cli.cli)
    listed = set(cli.cli.list_commands(ctx))
    assert CORE <= listed, sorted(CORE - listed)
    missing = [n for n in sorted(CORE) if not isinstance(cli.cli.get_command(ctx, n), click.Command)]
    assert not missing, missing


def test_a_broken_command_module_fails_loudly_instead_of_hiding_the_command():
    code = _BREAK_SERVE + "from edgeinfer.cli import main\nmain(['--help'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ModuleNotFoundError" in r.stderr and "starlette" in r.stderr, r.stderr[-800:]


def test_serve_is_listed_without_the_serve_extra():
    code = ("import sys\nfor m in ('starlette', 'uvicorn', 'prometheus_client'):\n    sys.modules[m] = None\n"
            "from edgeinfer.cli import main\nmain(['--help'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    assert any(line.split()[:1] == ["serve"] for line in r.stdout.splitlines()), r.stdout


def test_an_unknown_command_names_the_plugins_that_failed(monkeypatch, capfd):
    from edgeinfer import cli
    from edgeinfer.contract import registry

    class Failed:
        plugins = {"acme": PluginInfo("acme", "edgeinfer-acme", "1.0", error="import failed: ImportError: x"),
                   "fine": PluginInfo("fine", "edgeinfer-fine", "1.0")}

    monkeypatch.setattr(registry, "registry", lambda: Failed())
    code = cli.invoke(["acme-convert"])
    err = capfd.readouterr().err
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "No such command 'acme-convert'" in lines[0], err
    assert "plugin acme failed to load, see 'edgeinfer doctor'" in lines[0] and "fine" not in lines[0]


def test_an_unknown_command_without_failed_plugins_says_only_that(monkeypatch, capfd):
    from edgeinfer import cli
    from edgeinfer.contract import registry

    class AllFine:
        plugins = {"fine": PluginInfo("fine", "edgeinfer-fine", "1.0")}

    monkeypatch.setattr(registry, "registry", lambda: AllFine())
    assert cli.invoke(["acme-convert"]) == 2
    err = capfd.readouterr().err
    assert "No such command 'acme-convert'" in err and "plugin" not in err
