"""The backend contract: what a plugin implements and what the core adds on top.

A plugin subclasses :class:`Backend` and :class:`Session` and implements a few
small primitives (``probe``, ``convert``, ``open``, ``Session.infer``). The core
owns the public verbs (``quantize``, ``load``, ``run``, ``profile``): it validates
input, stamps and checks artifacts, times calls and turns backend exceptions into
:class:`~edgeinfer.errors.EdgeInferError` with a message a user can act on.

Tensors cross the boundary as NumPy arrays; models cross it as files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

if TYPE_CHECKING:  # numpy is imported where arrays are handled, so `edgeinfer plan` never loads it
    import numpy as np

    from edgeinfer.contract.decoder import NativeDecoder, StepDecoder

from edgeinfer.contract import remote_code, stamp
from edgeinfer.contract.boundary import plugin_call
from edgeinfer.contract.helpers import check_options, slowest_first
from edgeinfer.contract.measure import latency_stats, peak_rss_bytes
from edgeinfer.contract.records import Decoders, PagingLimit, Placement, Tensors
from edgeinfer.contract.resources import Accelerator
from edgeinfer.contract.schemes import normalize_scheme
from edgeinfer.contract.tensors import (  # re-exported: the contract's public names
    TensorSpec,
    validate_feeds,
    validate_outputs,
)
from edgeinfer.errors import BackendError, BackendUnavailableError, FeedError, InputError


@dataclass(frozen=True)
class Problem:
    """Something that keeps a backend or device from working, and the concrete fix."""

    message: str
    fix: str


@dataclass
class Probe:
    """What a backend finds on this machine."""

    available: bool
    versions: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # mode, NPU info, ...

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DeviceReading:
    """One device's load and memory as its driver reports them now (``None``: the device does not say)."""

    device: str  # the backend's own name for it: "NPU", "GPU.0", "core1", "0.1" (card.chip)
    utilization: float | None = None  # busy fraction, 0..1
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None


@dataclass(frozen=True)
class FreeMemory:
    """What a device has free for a decoder about to load there (:meth:`Backend.free_memory`)."""

    free_bytes: int  # free now
    device: str  # that device in the user's words, for the message: "NPU 1 chip 0 (910B4)"
    used_bytes: int | None = None  # already in use there (by other processes), when the driver says
    #: the planner's runtime profile (edgeinfer/data/runtimes.yaml) a decoder runs on there: its overhead
    #: and workspace are budgeted; None: weights and KV cache only
    runtime: str | None = None


@dataclass
class OpTime:
    name: str
    op_type: str
    time_ms: float
    exec_type: str = ""


@dataclass
class Profile:
    """Latency statistics of repeated runs, per-op times where the SDK gives them, peak memory."""

    runs: int
    latency_ms: dict[str, float]  # mean, p50, p90, p99, min, max
    ops: list[OpTime] = field(default_factory=list)  # top-N by time, empty when the SDK gives none
    peak_memory_bytes: int | None = None
    device: str = ""
    notes: dict[str, Any] = field(default_factory=dict)  # compile time, "simulator", page-in times, ...

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class CalibrationSet:
    """Feeds for post-training quantization: an iterable of ``{input name: array}`` with a length.

    ``samples`` is either a sequence of feed dicts or a zero-argument callable
    returning a fresh iterator (for sets too large to keep in memory) together with ``length``.
    """

    def __init__(
        self,
        samples: Sequence[Mapping[str, np.ndarray]] | Callable[[], Iterable[Mapping[str, np.ndarray]]],
        length: int | None = None,
    ):
        if callable(samples):
            if length is None:
                raise ValueError("a CalibrationSet built from a callable needs its length")
            self._factory, self._length = samples, length
        else:
            seq = list(samples)
            self._factory, self._length = (lambda: iter(seq)), len(seq)

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for feeds in self._factory():
            yield dict(feeds)

    def check(self, inputs: Sequence[TensorSpec]) -> None:
        """Raise a FeedError naming the first sample that does not match ``inputs``."""
        for i, feeds in enumerate(self):
            try:
                validate_feeds(inputs, feeds)
            except FeedError as e:
                raise FeedError(f"calibration sample {i}: {e.message}", e.hint) from None


class Session:
    """One loaded model on one device. Subclasses implement :meth:`infer` (and may override
    :meth:`op_times` for per-op profiling and :meth:`release` to free resources)."""

    backend_name: str = ""
    load_ms: float | None = None  # how long Backend.load took to open it

    def __init__(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], device: str = ""):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.device = device
        self._closed = False

    # --- primitives a backend implements -------------------------------------------------
    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run validated feeds; return every output by name."""
        raise NotImplementedError

    def op_times(self, feeds: dict[str, np.ndarray]) -> list[OpTime]:
        """Per-op times of one run, in any order (``profile`` sorts them); empty when the SDK gives none."""
        return []

    def release(self) -> None:
        """Free the runtime's resources."""

    # --- public verbs (owned by the core) --------------------------------------------------
    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        self._check_open()
        arrays = validate_feeds(self.inputs, feeds)
        outputs = plugin_call(self.backend_name, "infer", self.infer, arrays)
        return validate_outputs(self.outputs, outputs, self.backend_name)

    def profile(self, feeds: Mapping[str, Any], repeat: int = 10, warmup: int = 1, top: int = 10) -> Profile:
        if repeat < 1:
            raise InputError(f"repeat must be at least 1, got {repeat}")
        for _ in range(warmup):
            self.run(feeds)
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            self.run(feeds)
            times.append((time.perf_counter() - t) * 1e3)
        ops = slowest_first(plugin_call(self.backend_name, "op_times", self.op_times,
                                        validate_feeds(self.inputs, feeds)))[:top]
        return Profile(
            runs=repeat,
            latency_ms=latency_stats(times),
            ops=ops,
            peak_memory_bytes=peak_rss_bytes(),
            device=self.device,
            notes={**({"load_ms": self.load_ms} if self.load_ms is not None else {}), **self.profile_notes()},
        )

    def profile_notes(self) -> dict[str, Any]:
        """Extra facts for :meth:`profile` (compile time, simulator label, ...)."""
        return {}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InputError("this session is closed; load the model again to run it")


class Backend:
    """One accelerator family. Subclasses set ``name`` (and ``tensors`` / ``decoders``) and implement
    :meth:`probe`, :meth:`convert` and :meth:`open` (or :meth:`open_decoder`)."""

    name: ClassVar[str]
    #: the tensors capability as data: native suffixes, source formats, schemes, options, known gaps
    tensors: ClassVar[Tensors] = Tensors()
    #: the decoders capability as data: deploy schemes, exportable architectures, options
    decoders: ClassVar[Decoders] = Decoders()
    #: the Ray custom resource (edgeinfer/contract/resources.py) a bundle for a board needs, by the board's
    #: ``target`` or, when it has none, its ``family``: {"rk3588": "rk3588_npu"}; empty: not schedulable
    resource_names: ClassVar[dict[str, str]] = {}

    #: a backend implements ``probe`` and at least one of these capabilities
    REQUIRED = ("probe",)
    CAPABILITIES = {"tensors": ("convert", "open"), "decoders": ("open_decoder",),
                    "decoder_deploy": ("convert_decoder", "open_decoder")}

    # --- primitives a backend implements -------------------------------------------------
    def probe(self) -> Probe:
        raise NotImplementedError

    def device_readings(self, devices: Sequence[str]) -> list[DeviceReading]:
        """Utilisation and memory of the devices behind ``devices`` (``--devices`` entries of ``edgeinfer serve``,
        "" = the default device), read now for /metrics; [] where the device exposes none. Called at scrape time
        (cached a few seconds), so keep it under a second; it may raise: the caller drops that backend's readings."""
        return []

    def accelerators(self, probe: Probe) -> list[Accelerator]:
        """The accelerators ``probe`` found, as Ray custom resources (docs/fleet.md); default: none."""
        return []

    def convert(
        self, model: Path, scheme: str, calibration: CalibrationSet | None, out: Path, **options: Any
    ) -> dict[str, Any]:
        """Write the native artifact for ``model`` at ``out``; return stamp facts
        (``target``, ``inputs`` and ``outputs``: lists of TensorSpec) about it."""
        raise NotImplementedError

    def open(self, artifact: Path, device: str | None, stamp: Mapping[str, Any], **options: Any) -> Session:
        """Load a native artifact and return a Session on ``device``; ``stamp`` is the artifact's stamp as
        :meth:`load` read and checked it ({} for an unstamped file): do not read it again."""
        raise NotImplementedError

    def open_decoder(self, model: Path, device: str | None, context: int, slots: int,
                     **options: Any) -> StepDecoder | NativeDecoder:
        """Load a decoder (language) model with a KV cache of ``context`` positions × ``slots``
        sequences allocated now: a step decoder or a native loop, see :mod:`edgeinfer.contract.decoder`.
        ``model`` is a Hugging Face causal-LM directory or an artifact written by :meth:`convert_decoder`."""
        raise NotImplementedError

    def convert_decoder(
        self, model: Path, scheme: str, context: int, out: Path, calibration: Sequence[str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Write this backend's decoder artifact for the Hugging Face causal LM ``model`` into the
        directory ``out`` (created by the core, empty), built for ``context`` positions in ``scheme``
        (one of ``decoders.schemes``, canonical name); ``calibration`` is text for data-aware weight
        compression (ignore it when the scheme needs none). Return stamp facts (``target`` and anything
        :meth:`open_decoder` needs back); :meth:`open_decoder` must accept ``out`` as its model.
        Optional: with :meth:`open_decoder` it makes the "decoder_deploy" capability that
        ``edgeinfer deploy`` of a decoder needs."""
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        """Versions recorded in stamps; ``toolkit`` is checked when an artifact loads (:meth:`refuses_toolkit`)."""
        return {}

    def refuses_toolkit(self, made: str, have: str) -> str | None:
        """Why an artifact stamped with toolkit ``made`` cannot load with the installed ``have`` (both from
        :meth:`versions`, and different), or None. Default: refused, as most vendor formats are tied to the
        release that wrote them; a runtime whose releases load older artifacts returns
        ``stamp.refuses_newer(made, have)``."""
        return f"was built with {made} but {have} is installed; convert the model again (or install {made})"

    def refuses_target(self, target: str, device: str | None) -> str | None:
        """Why an artifact built for ``target`` cannot run on ``device`` here, or None (checked by
        :meth:`load` from the stamp's ``target``; default: every target runs). Raise
        ``BackendUnavailableError`` where what is missing is this machine's (a tool, a device)."""
        return None

    # --- optional facts the core asks (docs/writing-a-backend.md); the defaults fit most runtimes ---
    def artifact_files(self, artifact: Path) -> list[Path]:
        """The files that make up ``artifact`` on storage (what a paged session pages in): the file
        and its weight side files. Default: the file and an ONNX external-data ``<name>.data``."""
        side = artifact.with_name(artifact.name + ".data")
        return [artifact, side] if side.exists() else [artifact]

    def simulation_files(self, bundle: Path) -> list[Path]:
        """The files of the bundle directory ``bundle`` that only this backend's simulator on the converting machine
        reads, never a board (``deploy --board-only`` leaves them out). Default: none."""
        return []

    def paging_limit(self, device: str | None) -> PagingLimit | None:
        """Limits of layer-paged execution on ``device``, or None when there are none (the default)."""
        return None

    def placement(self, entry: str) -> Placement:
        """What one ``serve --devices`` entry means for a worker process. Default: a name (CPU, NPU,
        GPU.1) is the device, a bare index means the default device."""
        return Placement() if entry.isdigit() else Placement(device=entry)

    def check_device_entry(self, entry: str) -> None:
        """Raise :class:`InputError` when ``serve --devices`` entry ``entry`` means nothing here
        (before any worker starts). Default: every entry is accepted."""

    def free_memory(self, device: str | None) -> FreeMemory | None:
        """What ``device`` has free now for a decoder, or None when it cannot tell (the default). Before
        :meth:`open_decoder` the core plans the decoder's weights, KV cache and workspace and refuses one
        that does not fit, saying what to change; the backend only reports the fact. Keep it quick."""
        return None

    # --- public verbs (owned by the core) --------------------------------------------------
    def quantize(
        self,
        model: str | os.PathLike[str],
        scheme: str | None = None,
        calibration: CalibrationSet | None = None,
        out: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> Path:
        """Convert (and quantize) ``model`` to this backend's artifact at ``out``; stamp it."""
        src = _existing_file(model)
        remote_code.allowed(src)  # a model directory that names code of its own: refused unless trusted
        parsed = normalize_scheme(scheme or self.tensors.default_scheme)
        canonical = parsed.name  # e.g. "w4a16_g128"; convert() may call normalize_scheme for the group size
        if parsed.family not in self.tensors.schemes:
            raise InputError(f"backend {self.name!r} cannot produce scheme {canonical!r}; it supports: "
                             f"{', '.join(self.tensors.schemes)}", kind="not_supported")
        check_options(options, self.tensors.convert_options, f"backend {self.name!r} convert")
        dst = Path(out) if out is not None else src.with_suffix(self.tensors.native[0])
        dst.parent.mkdir(parents=True, exist_ok=True)
        partial = [dst, stamp.stamp_path(dst)]
        for p in partial:
            p.unlink(missing_ok=True)
        try:
            facts = plugin_call(self.name, f"convert {src.name} to {canonical}", self.convert, src, canonical,
                                calibration, dst, **options)
        except BaseException:
            _remove(partial)
            raise
        if not dst.exists():
            raise BackendError(f"{self.name} reported success but wrote no artifact at {dst}")
        stamp.write(dst, backend=self, scheme=canonical, source=src, **facts)
        return dst

    def quantize_decoder(self, model: Path, scheme: str, context: int, out: Path,
                         calibration: Sequence[str] | None = None, **options: Any) -> Path:
        """Convert the decoder ``model`` with :meth:`convert_decoder` into the new directory ``out``; stamp it."""
        if not self.capable("decoder_deploy"):
            raise BackendUnavailableError(f"backend {self.name!r} cannot convert decoder (language) models: it "
                                          "implements no convert_decoder", "deploy for a board whose backend does")
        scheme, family = normalize_scheme(scheme).name, normalize_scheme(scheme).family
        if family not in self.decoders.schemes:
            raise InputError(f"backend {self.name!r} cannot convert decoders to {scheme!r}; it supports: "
                             f"{', '.join(self.decoders.schemes)}", kind="not_supported")
        check_options(options, self.decoders.convert_options, f"backend {self.name!r} decoder conversion")
        remote_code.allowed(model)  # before the backend's loaders see it, whatever they pass on
        out.mkdir(parents=True)
        try:
            facts = plugin_call(self.name, f"convert the decoder {model.name} to {scheme}", self.convert_decoder,
                                model, scheme, context, out, calibration, **options)
        except BaseException:
            _remove([out])
            raise
        own = {"scheme": scheme, "context": context}  # what the core stamps itself; a backend may repeat it
        if any(facts.pop(k) != v for k, v in own.items() if k in facts):
            raise BackendError(f"{self.name} convert_decoder reported another scheme or context than asked")
        stamp.write(out, backend=self, scheme=scheme, source=model, context=context, **facts)
        return out

    def load(self, artifact: str | os.PathLike[str], device: str | None = None, **options: Any) -> Session:
        """Load a native artifact (checking its stamp and options) and return a Session, timed in ``load_ms``."""
        path = Path(artifact)
        if not path.exists():
            raise InputError(f"model file not found: {path}", kind="model_not_found")
        check_options(options, self.tensors.open_options, f"backend {self.name!r}")
        stamped = stamp.check(path, backend=self, device=device) or {}
        t0 = time.perf_counter()
        session = self._opened(path.name, self.open, path, device, stamped, **options)
        if not isinstance(session, Session):
            raise BackendError(f"backend {self.name!r} failed: its open returned {type(session).__name__}, not a "
                               "Session")
        session.load_ms = (time.perf_counter() - t0) * 1e3
        return session

    def load_decoder(
        self, model: str | os.PathLike[str], device: str | None = None, context: int = 2048, slots: int = 1,
        **options: Any,
    ) -> StepDecoder | NativeDecoder:
        """Load a decoder model for generation (the core's loop or the backend's own)."""
        path = _existing_file(model)
        if not self.capable("decoders"):
            raise InputError(f"backend {self.name!r} does not run decoder (language) models", kind="not_supported")
        for name, value in (("context", context), ("slots", slots)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        check_options(options, self.decoders.options, f"backend {self.name!r} decoder")
        remote_code.allowed(path)
        # the one stamp read of the generate path: another backend's or toolkit's artifact is refused; the
        # context of an artifact of convert_decoder is a limit
        built = (stamp.check(path, backend=self, device=device) or {}).get("context")
        if isinstance(built, int) and context > built:
            raise InputError(f"{path.name} was converted for a context of {built} tokens, not {context}; use "
                             f"{built} or less, or convert again for {context}")
        return self._opened(f"the decoder in {path.name}", self.open_decoder, path, device, context, slots, **options)

    def open_vocabulary(self, path: Path) -> Any:
        """Override: the tokenizer of the decoder file ``path`` read from the file itself (a
        :class:`~edgeinfer.contract.decoder.Vocabulary`), for a file with no tokenizer.json next to it; None
        (the default): the file holds none this backend reads."""
        return None

    def read_vocabulary(self, model: str | os.PathLike[str]) -> Any:
        """:meth:`open_vocabulary` through the plugin-call boundary (a failure is this backend's, tagged)."""
        path = _existing_file(model)
        return plugin_call(self.name, f"read the vocabulary of {path.name}", self.open_vocabulary, path)

    def _opened(self, what: str, open_fn: Any, *args: Any, **options: Any) -> Any:
        """``open_fn(*args, **options)`` through the plugin-call boundary; tagged with our name."""
        loaded = plugin_call(self.name, f"open {what}", open_fn, *args, **options)
        if loaded is None:
            raise BackendError(f"backend {self.name!r} failed: it returned nothing when asked to open {what}")
        loaded.backend_name = self.name
        return loaded

    @classmethod
    def cannot_build(cls, kind: str, runtime: str | None = None) -> str | None:
        """Why this installation cannot build ``kind`` ("encoder" or "decoder") models for board runtime
        ``runtime`` with this backend (None: the board's backend runtime, which every capable backend builds),
        in a phrase naming what is missing; None when it can. Cheap: reads declarations and looks modules up
        (``Needs``), imports no SDK; ``edgeinfer plan`` and ``deploy`` ask it before choosing a runtime."""
        needed = cls.CAPABILITIES["decoder_deploy" if kind == "decoder" else "tensors"]
        absent = [m for m in needed if getattr(cls, m) is getattr(Backend, m)]
        if absent:
            return f"backend {cls.name!r} builds no {kind} models: it implements no {absent[0]}"
        if runtime is None:
            return None
        extra = {**cls.decoders.runtimes, **cls.decoders.builds} if kind == "decoder" else {}
        if runtime not in extra:
            return f"backend {cls.name!r} builds no {kind} models for runtime {runtime}"
        needs = extra[runtime]
        return needs.missing() if needs else None

    @classmethod
    def capable(cls, capability: str) -> bool:
        """Whether this backend implements every method of ``capability`` ("tensors", "decoders")."""
        return all(getattr(cls, m) is not getattr(Backend, m) for m in cls.CAPABILITIES[capability])

    def is_native(self, path: Path) -> bool:
        """Whether :meth:`load` takes ``path`` as it is (by suffix); other files are converted first."""
        return path.suffix.lower() in self.tensors.native


def _existing_file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.exists():
        raise InputError(f"model file not found: {p}", kind="model_not_found")
    return p


def _remove(paths: Iterable[Path]) -> None:
    for p in paths:
        if p.is_dir():
            import shutil

            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)

