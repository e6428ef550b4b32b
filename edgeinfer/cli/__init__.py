"""The ``edgeinfer`` command line: each command a thin shell over a library function.

Conventions: user errors print one line on stderr and exit 2 (no traceback
unless --debug); ``--json`` puts only JSON on stdout; colour only on a terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

import click

from edgeinfer import errors, progress
from edgeinfer.contract.names import NOISY_LOGGERS, NOISY_MODULES
from edgeinfer.errors import EdgeInferError
from edgeinfer.version import __version__


class EdgeInferGroup(click.Group):
    """Every failure of a command as one line on stderr and its exit code (tracebacks only with --debug), and
    under ``--json`` as one JSON object on stdout (:func:`fail`). The core commands (:data:`CORE_COMMANDS`) are
    imported on first use; a plugin's command of the same name replaces one."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *CORE_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in CORE_COMMANDS:
            import importlib

            module, attr = CORE_COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(f"edgeinfer.cli.{module}"), attr), cmd_name)
        return super().get_command(ctx, cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[JSON_META] = wants_json(args)  # before the command parses them: its usage errors answer in JSON too
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        as_json = bool(ctx.meta.get(JSON_META))
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.NoArgsIsHelpError):
            raise
        except click.UsageError as e:
            fail(errors.USAGE, "bad_input", usage_message(e), as_json)
            ctx.exit(errors.USAGE)
        except click.ClickException as e:
            fail(e.exit_code, "bad_input", _one_line(e.format_message()), as_json)
            ctx.exit(e.exit_code)
        except (click.Abort, KeyboardInterrupt) as e:
            code = interrupted(e, as_json)
            ctx.exit(code)
        except EdgeInferError as e:
            if _debug(ctx):
                raise
            fail(e.exit_code, e.kind, e.one_line(), as_json, e.details)
            ctx.exit(e.exit_code)
        except Exception as e:
            if _debug(ctx):
                raise
            first = (str(e).strip().splitlines() or [""])[0]
            fail(errors.UNAVAILABLE, "internal_error", f"internal error {type(e).__name__}: {first} (rerun with "
                 "--debug for the traceback and report it)", as_json)
            ctx.exit(errors.UNAVAILABLE)


JSON_META = "edgeinfer.json"


def wants_json(args: list[str]) -> bool:
    """Whether the command line asks for JSON: ``--json`` among its options (before a ``--``)."""
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def fail(code: int, kind: str, message: str, as_json: bool, details: dict | None = None) -> None:
    """A failure as scripts read it: ``error: MESSAGE`` on stderr and, under ``--json``, exactly one object
    ``{"error": {"code", "kind", "message"}}`` on stdout (kinds and codes: :data:`edgeinfer.errors.KINDS`), with
    ``details`` where the error carries figures (a failed golden check: its report)."""
    import json

    click.echo(f"error: {message}", err=True)
    if as_json:
        body = {"code": code, "kind": kind, "message": message, **({"details": details} if details else {})}
        click.echo(json.dumps({"error": body}, default=str))


def usage_message(e: click.UsageError) -> str:
    """A click usage error in one line, pointing at the command's help."""
    where = e.ctx.command_path if e.ctx else "edgeinfer"
    message = _one_line(e.format_message()).rstrip(".")
    if message.startswith("No such command"):
        message += _failed_plugins_hint()
    return f"{message} (see '{where} --help')"


def interrupted(e: BaseException, as_json: bool) -> int:
    """Report Ctrl-C (click.Abort or KeyboardInterrupt) or SIGTERM (:class:`errors.Interrupted`); its exit code."""
    import signal

    cause = e if isinstance(e, KeyboardInterrupt) else e.__cause__ or e.__context__
    signum = getattr(cause, "signum", signal.SIGINT)
    fail(128 + signum, "interrupted", f"interrupted ({signal.Signals(signum).name}); nothing was left behind",
         as_json)
    return 128 + signum


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.find_root().params.get("debug")) or os.environ.get("EDGEINFER_DEBUG") == "1"


@click.group(cls=EdgeInferGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edgeinfer")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (implies --verbose).")
@click.option("--verbose", "-v", is_flag=True, help="Show third-party logs, warnings, progress bars and native "
              "output of conversions and loads (on stderr).")
@click.option("--quiet", is_flag=True, help="No progress on stderr (spinners, bars, the plain lines written "
              "every 10 s off a terminal); notes, warnings and errors stay.")
def cli(debug: bool, verbose: bool, quiet: bool) -> None:
    """Plan, convert, run and serve the same model on edge NPUs.

    \b
    Exit codes: 0 ok; 1 negative verdict (does not fit, check failed);
                2 what you passed is wrong (input, option, board, bundle, port);
                3 a plugin, backend or device failed or is unavailable;
                130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
    With --json, a failure prints {"error": {"code", "kind", "message"[, "details"]}} on stdout.
    """
    if debug or verbose:
        os.environ[progress.VERBOSE_ENV] = "1"
    else:
        quiet_third_party()
    if quiet:
        os.environ[progress.QUIET_ENV] = "1"


def quiet_third_party() -> None:
    """Keep library chatter (torchao .so load failures, torch deprecation logs, NNCF bars and tables,
    transformers advisories) off stderr. Call before those libraries load; the CLI does, unless --verbose.
    Variables the user set themselves are left alone."""
    if progress.verbose():
        return
    os.environ.setdefault("TORCH_LOGS", "-torch")  # torch's own log handler: errors only
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=NOISY_MODULES)
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category)


# --- start-up ------------------------------------------------------------------------------------

#: every core command: name -> (module under edgeinfer.cli, attribute). A command's module is imported when
#: the command runs or ``--help`` lists it, without a guard: a broken import fails loudly, it never hides a
#: command, and `edgeinfer plan` does not import deploy's, serve's or bench's modules. ``serve`` reports a
#: missing [serve] extra itself, as exit 3 with the install line, when it runs.
CORE_COMMANDS = {
    "backends": ("backends", "backends"), "doctor": ("backends", "doctor"), "run": ("run", "run"),
    "deploy": ("deploy", "deploy"), "golden": ("deploy", "golden"), "verify": ("deploy", "verify"),
    "bench": ("bench", "bench"), "profile": ("profile", "profile_cmd"), "plan": ("plan", "plan_cmd"),
    "boards": ("plan", "boards_cmd"), "generate": ("generate", "generate_cmd"), "chat": ("generate", "chat_cmd"),
    "calibrate": ("calibrate", "calibrate_cmd"), "serve": ("serve", "serve_cmd"),
    "ray-resources": ("fleet", "ray_resources_cmd"), "ray-node": ("fleet", "ray_node_cmd"),
    "cache": ("cache", "cache_cmd"),
}

_ATTACHED = False


def _attach_optional_commands() -> None:
    """Commands from plugins (once per process); a plugin that fails is named by ``unknown command`` errors."""
    global _ATTACHED
    from edgeinfer.contract import registry as plugins

    if _ATTACHED:
        return
    _ATTACHED = True
    plugins.registry().add_commands(cli)


def _failed_plugins_hint() -> str:
    """For an unknown command: the plugins that failed to load (one of them may have provided it)."""
    from edgeinfer.contract import registry as plugins

    failed = sorted(name for name, info in plugins.registry().plugins.items() if info.error)
    if not failed:
        return ""
    return f"; plugin {', '.join(failed)} failed to load, see 'edgeinfer doctor'"


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    return f"warning: {' '.join(str(message).split())}\n"


def install_signal_handlers() -> None:
    """SIGTERM unwinds like Ctrl-C (temporaries removed, exit 143) in this process only. A child forked from it
    (a library's helper, e.g. a sender process) is not ours: it gets the default action back at the fork, and
    the handler gives it back too should it run in another pid, so a SIGTERM ends such a child quietly (-15)
    instead of raising edgeinfer's Interrupted there. Exec'd children start with default handlers anyway."""
    import signal

    owner = os.getpid()

    def on_sigterm(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise errors.Interrupted(signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    os.register_at_fork(after_in_child=_default_sigterm)


def _default_sigterm() -> None:
    import signal

    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # not the main thread of the child: on_sigterm hands the signal back instead
        pass


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def invoke(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` and return its exit code; every error is one line on stderr (and one JSON object
    on stdout under ``--json``).

    Click usage errors become ``error: ... (see 'edgeinfer CMD --help')``, exit 2 (not click's
    multi-line usage block); Ctrl-C exits 130 and SIGTERM 143 (128 + signal), after the
    interrupted command removed its temporaries. A command's failures are reported by
    :meth:`EdgeInferGroup.invoke`; this catches those before a command runs (options of ``edgeinfer`` itself).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(args)
    try:
        rv = cli.main(args=args, prog_name="edgeinfer", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else "")
        click.echo("error: missing command (see 'edgeinfer --help')", err=True)
        return errors.USAGE
    except click.UsageError as e:
        fail(errors.USAGE, "bad_input", usage_message(e), as_json)
        return errors.USAGE
    except click.ClickException as e:
        fail(e.exit_code, "bad_input", _one_line(e.format_message()), as_json)
        return e.exit_code
    except (click.Abort, KeyboardInterrupt) as e:
        return interrupted(e, as_json)
    except SystemExit as e:  # a plugin's command that calls sys.exit
        return e.code if isinstance(e.code, int) else errors.USAGE if e.code else errors.OK
    return rv if isinstance(rv, int) else errors.OK


def main(argv: list[str] | None = None) -> None:
    import warnings

    from edgeinfer import telemetry

    telemetry.off(offline=True)
    warnings.formatwarning = _one_line_warning  # e.g. an NPU that fell back to CPU: one line, no source echo
    install_signal_handlers()
    from edgeinfer.cli.pipes import PipeSafeStdout

    sys.stdout = PipeSafeStdout(sys.stdout)  # type: ignore[assignment]  # `edgeinfer plan … | head`: no EPIPE
    _attach_optional_commands()
    code = invoke(argv)
    _forget_caught_interrupts()
    sys.exit(code)


def _forget_caught_interrupts() -> None:
    """CPython (3.11, 3.12) records a KeyboardInterrupt that ended code run from a string — ``exec("...")``, as
    ``dataclasses`` does to build each class's ``__init__`` during an import — even when a caller catches it,
    and under ``python -m`` then ends the process by SIGINT instead of with its exit code (``Py_RunMain`` →
    ``exit_sigint`` in CPython's ``Modules/main.c``): a Ctrl-C that landed in an import during the ONNX export
    exited -2, not 130, after the deploy had cleaned up and said so. Running a string resets the record
    (``run_eval_code_obj`` in ``Python/pythonrun.c``)."""
    exec("pass")  # noqa: S102 - a constant string, for the side effect above

