"""Plugin discovery: entry points in group ``edgeinfer``, loaded lazily, once.

A plugin that fails to import or register is recorded with its error and
reported by ``edgeinfer backends`` / ``doctor``; it never breaks unrelated
commands. ``EDGEINFER_PLUGINS`` (comma-separated entry-point names; empty = none)
restricts which plugins load.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import pluggy

from edgeinfer.contract import hookspecs
from edgeinfer.contract.backend import Backend, Probe, Problem
from edgeinfer.contract.names import BUNDLED_PLUGINS
from edgeinfer.contract.records import Decoders, Tensors
from edgeinfer.errors import BackendUnavailableError

GROUP = "edgeinfer"


@dataclass
class PluginInfo:
    name: str  # entry-point name
    distribution: str
    version: str
    error: str | None = None  # why it failed to import or register
    missing: str | None = None  # the module its import found not installed (ModuleNotFoundError), if that was why


@dataclass
class BackendEntry:
    cls: type[Backend]
    plugin: PluginInfo


class Registry:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self._backends: dict[str, BackendEntry] | None = None
        self._boards: list[tuple[Any, PluginInfo]] | None = None
        self._alone: dict[str, BackendEntry | None] = {}  # backend(): registered from its own plugin only
        self._probes: dict[str, Probe] = {}
        self._load_entry_points()

    def _selected(self) -> set[str] | None:
        raw = os.environ.get("EDGEINFER_PLUGINS")
        if raw is None:
            return None
        return {n.strip() for n in raw.split(",") if n.strip()}

    def _load_entry_points(self) -> None:
        wanted = self._selected()
        for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
            if wanted is not None and ep.name not in wanted:
                continue
            info = _info(ep)
            self.plugins[ep.name] = info
            try:
                module = ep.load()
                self.pm.register(module, name=ep.name)
            except Exception as e:  # a broken plugin must not break the others
                info.error = f"import failed: {type(e).__name__}: {e}"
                if isinstance(e, ModuleNotFoundError):
                    info.missing = e.name

    def _impls(self, hook: str) -> list[tuple[str, PluginInfo, Any]]:
        """(plugin, info, caller) for every plugin implementing ``hook``, in plugin order: ``caller`` is pluggy's
        hook caller restricted to that one plugin, so that a failing plugin is named and the others still run."""
        implementing = {impl.plugin_name for impl in getattr(self.pm.hook, hook).get_hookimpls()}
        out = []
        for name, info in self.plugins.items():
            if name in implementing:
                others = [p for n, p in self.pm.list_name_plugin() if n != name]
                out.append((name, info, self.pm.subset_hook_caller(hook, remove_plugins=others)))
        return out

    @property
    def backends(self) -> dict[str, BackendEntry]:
        """Backends by name, registered on first use (``--help`` never needs them; ``plan`` only for a decoder
        planned on its board's backend runtime, to read the architectures the backend exports)."""
        if self._backends is None:
            self._backends = {}
            for name, info, impl in self._impls("register_backends"):
                self._register_backends(name, impl, info)
        return self._backends

    def backend(self, name: str) -> BackendEntry | None:
        """Backend ``name``, registering as few plugins as it takes: the plugin of the same entry-point name alone
        first (a plugin is named after its backend: ``plan`` reads one board backend's declarations and need not
        import every plugin's backend module), then every plugin when that one does not provide it as the
        contract asks. A backend name two plugins claim is then that plugin's, where ``backends`` names the
        first plugin's and records the other's error."""
        if self._backends is None:
            if name not in self._alone:
                self._alone[name] = self._register_alone(name)
            if self._alone[name] is not None:
                return self._alone[name]
        return self.backends.get(name)

    def probe(self, name: str) -> Probe:
        """Backend ``name``'s probe, run once per process (probes import SDKs and may start devices); a probe
        that raises is a failed Probe naming the exception, so one backend never takes a listing down."""
        if name not in self._probes:
            entry = self.backend(name)
            if entry is None:
                raise BackendUnavailableError(f"unknown backend {name!r}", install_hint(name))
            try:
                self._probes[name] = entry.cls().probe()
            except Exception as e:
                self._probes[name] = Probe(available=False, problems=[Problem(
                    f"probe failed: {type(e).__name__}: {e}",
                    f"run with --debug and report it to {entry.plugin.distribution}'s authors")])
        return self._probes[name]

    def _register_alone(self, name: str) -> BackendEntry | None:
        for plugin, info, impl in self._impls("register_backends"):
            if plugin != name:
                continue
            found: list[type] = []
            try:
                impl(register=found.append)
            except Exception:  # registering every plugin records the error
                return None
            for cls in found:
                if getattr(cls, "name", None) == name and contract_problem(cls) is None:
                    return BackendEntry(cls, info)
        return None

    def _register_backends(self, name: str, impl: Any, info: PluginInfo) -> None:
        found: list[type] = []
        try:
            impl(register=found.append)
        except Exception as e:
            info.error = f"register_backends failed: {type(e).__name__}: {e}"
            return
        for cls in found:
            problem = contract_problem(cls)
            if problem:
                info.error = f"plugin {name!r}: {problem}"
                continue
            if cls.name in self._backends:
                other = self._backends[cls.name].plugin.name
                info.error = f"plugin {name!r}: backend name {cls.name!r} is already registered by {other!r}"
                continue
            self._backends[cls.name] = BackendEntry(cls, info)

    def boards(self) -> list[tuple[Any, PluginInfo]]:
        """(path or Board, plugin) pairs from every plugin's ``register_boards``."""
        if self._boards is None:
            self._boards = []
            for _name, info, impl in self._impls("register_boards"):
                try:
                    impl(register=lambda b, _i=info: self._boards.append((b, _i)))
                except Exception as e:
                    info.error = f"register_boards failed: {type(e).__name__}: {e}"
        return self._boards

    def add_commands(self, cli: Any) -> None:
        for _name, info, impl in self._impls("register_commands"):
            try:
                impl(cli=cli)
            except Exception as e:
                info.error = f"register_commands failed: {type(e).__name__}: {e}"


def contract_problem(cls: Any) -> str | None:
    """Why ``cls`` does not satisfy the backend contract, or None."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        return f"{cls!r} is not a subclass of edgeinfer.contract.backend.Backend"
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        return f"backend class {cls.__name__} does not set `name`"
    for attr, record in (("tensors", Tensors), ("decoders", Decoders)):
        if not isinstance(getattr(cls, attr), record):
            return (f"backend {cls.name!r}: `{attr}` must be a {record.__name__}(...) record "
                    f"(edgeinfer.contract), not {getattr(cls, attr)!r}")
    for method in Backend.REQUIRED:
        if getattr(cls, method) is getattr(Backend, method):
            return f"backend {cls.name!r} does not implement required method `{method}`"
    if not any(cls.capable(c) for c in Backend.CAPABILITIES):
        missing = next(m for m in Backend.CAPABILITIES["tensors"] if getattr(cls, m) is getattr(Backend, m))
        return (f"backend {cls.name!r} does not implement required method `{missing}` "
                "(or `open_decoder` for a decoder-only backend)")
    return None


def _info(ep: EntryPoint) -> PluginInfo:
    dist = getattr(ep, "dist", None)
    return PluginInfo(
        name=ep.name,
        distribution=dist.metadata["Name"] if dist else "?",
        version=dist.version if dist else "?",
    )


_registry: Registry | None = None
_lock = threading.Lock()


def registry() -> Registry:
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry()
        return _registry


def reset() -> None:
    """Forget discovered plugins (tests change EDGEINFER_PLUGINS or install plugins)."""
    global _registry
    with _lock:
        _registry = None


def backend_names() -> list[str]:
    return sorted(registry().backends)


def get_backend(name: str) -> Backend:
    """Backend ``name``, importing only its own plugin's backend module where that plugin provides it; every
    plugin is registered only to list the installed ones when there is none of that name."""
    reg = registry()
    entry = reg.backend(name)
    if entry is not None:
        return entry.cls()
    known = ", ".join(sorted(reg.backends)) or "none"  # registering every plugin records their failures
    own = reg.plugins.get(name)
    if own is not None and own.error:
        raise BackendUnavailableError(*unavailable(name))
    failed = [f"{p.name} from distribution {p.distribution} ({p.error})" for p in reg.plugins.values() if p.error]
    msg = f"unknown backend {name!r}; available: {known}"
    if failed:
        msg += "; plugins that failed to load: " + "; ".join(failed)
    raise BackendUnavailableError(msg, unavailable(name)[1])


def decoder_file(path: Path) -> tuple[str, str] | None:
    """(backend, board runtime) of the installed backend that opens the decoder file ``path`` as it is (by its
    suffix, ``Decoders.native``), or None."""
    suffix = path.suffix.lower()
    for name, entry in sorted(registry().backends.items()):
        runtime = entry.cls.decoders.native.get(suffix)
        if runtime:
            return name, runtime
    return None


def runtime_builder(runtime: str) -> BackendEntry | None:
    """The installed backend that builds board runtime ``runtime`` as its own (``Decoders.builds``), or None.
    Registers every plugin: asked only for a runtime the board's own backend does not build."""
    for _name, entry in sorted(registry().backends.items()):
        if runtime in entry.cls.decoders.builds:
            return entry
    return None


BUNDLED = BUNDLED_PLUGINS


def install_hint(name: str) -> str:
    """How to get backend ``name``: EDGEINFER_PLUGINS, the plugin folder of a clone, or a third party's package."""
    if os.environ.get("EDGEINFER_PLUGINS") is not None and any(ep.name == name for ep in entry_points(group=GROUP)):
        return f"the plugin is installed but EDGEINFER_PLUGINS leaves it out: add {name} to it, or unset it"
    if name in BUNDLED:
        return f"install its plugin from a clone of edgeinfer: pip install ./plugins/{name}"
    return f"install the distribution that registers backend {name!r} in the 'edgeinfer' entry-point group"


def repair_hint(info: PluginInfo) -> str:
    """How to fix plugin ``info``, installed but failing to load: what it lacks, and its distribution to reinstall
    (by name: a third party's plugin has no folder here; this repository's plugins add theirs)."""
    dist = info.distribution
    if info.missing:
        fix = (f"install the package that provides module {info.missing!r} (a dependency of {dist}), or reinstall "
               f"{dist} with its dependencies")
    else:
        fix = f"fix what the error names, or reinstall {dist}"
    if info.name in BUNDLED:
        return f"{fix}; from a clone of edgeinfer: pip install --force-reinstall ./plugins/{info.name}"
    return f"{fix} (pip install --force-reinstall {dist}, from where you got it)"


def unavailable(name: str) -> tuple[str, str]:
    """(what is wrong, the fix) when backend ``name`` is not registered: its plugin (the entry point of that
    name) is installed but failed to import or register, or no installed plugin provides it."""
    reg = registry()
    info = reg.plugins.get(name)
    if info is not None and reg.backend(name) is None:
        reg.backends  # noqa: B018 - registering every plugin records why this one failed
    if info is not None and info.error:
        if info.missing:
            what = f"installed but fails to import: module {info.missing!r} is not installed"
        else:
            what = f"installed but fails to load ({info.error})"
        return (f"backend {name!r}: its plugin (distribution {info.distribution} {info.version}) is {what}",
                repair_hint(info))
    return f"backend {name!r} is not installed (no plugin provides it)", install_hint(name)
