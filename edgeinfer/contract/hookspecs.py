"""The plugin contract: the hooks a plugin may implement.

A plugin is a module registered under the entry-point group ``edgeinfer``::

    [project.entry-points.edgeinfer]
    mynpu = "edgeinfer_mynpu"

and decorates plain functions with :data:`hookimpl`::

    from edgeinfer.contract import hookimpl

    @hookimpl
    def register_backends(register):
        register(MyNpuBackend)

Plugin modules are imported on every CLI start: keep their top level light and
import the vendor SDK inside the methods that need it.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("edgeinfer")
hookimpl = pluggy.HookimplMarker("edgeinfer")


@hookspec
def register_backends(register: Callable[[type], None]) -> None:
    """Register backend classes.

    Called once, the first time edgeinfer needs the list of backends (``edgeinfer
    backends``, ``edgeinfer.load``, ...). Call ``register(BackendClass)`` once per
    :class:`edgeinfer.contract.backend.Backend` subclass the plugin provides. The class must
    set ``name`` and implement ``probe``, ``convert`` and ``open``; registration
    fails, naming the plugin and the missing method, otherwise. Do not import the
    vendor SDK here.
    """


@hookspec
def register_boards(register: Callable[[Any], None]) -> None:
    """Register extra board profiles.

    Called once, the first time edgeinfer loads board profiles (``edgeinfer
    boards``, ``edgeinfer plan``). Call ``register(path)`` with the path of a board
    YAML file (same schema as the files under ``boards/``), or ``register(board)``
    with a :class:`edgeinfer.planning.boards.Board`. A board whose name is already taken is
    reported as an error of this plugin.
    """


@hookspec
def register_commands(cli: Any) -> None:
    """Add commands to the ``edgeinfer`` command line.

    Called once at CLI start-up with the root :class:`click.Group`; add commands with
    ``@cli.command()`` or ``cli.add_command(cmd)``. Commands should raise
    :class:`edgeinfer.errors.EdgeInferError` subclasses for user errors so the CLI
    prints one line and exits with the right code.
    """
