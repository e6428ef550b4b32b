"""What a backend plugin imports: the hook specs, the Backend and Session base classes, the decoder
base classes, the records a backend declares and answers, tensor specs, stamps, the plugin registry,
and what a plugin needs from the core besides — scheme names, measurement, generation options, the
paging schedule, the conversion cache, progress, native output contained around convert and load
(``native_output``) and the core's version. The contract is the bottom layer: it imports no other room
of the core, so a plugin that imports only ``edgeinfer.contract*``, ``edgeinfer.errors`` and
``edgeinfer.testing*`` depends on nothing the core may move. See docs/writing-a-backend.md for the
whole contract."""

from edgeinfer.contract import stamp
from edgeinfer.contract.backend import (
    Backend,
    CalibrationSet,
    FreeMemory,
    OpTime,
    Probe,
    Problem,
    Profile,
    Session,
    TensorSpec,
    validate_feeds,
    validate_outputs,
)
from edgeinfer.contract.hookspecs import hookimpl
from edgeinfer.contract.measure import current_rss_bytes, latency_stats, peak_rss_bytes, reset_peak_rss
from edgeinfer.contract.records import Decoders, Needs, PagingLimit, Placement, Tensors
from edgeinfer.contract.resources import Accelerator
from edgeinfer.contract.schedule import Schedule
from edgeinfer.contract.schemes import Scheme, known_schemes, normalize_scheme
from edgeinfer.progress import Progress, verbose
from edgeinfer.version import __version__

__all__ = ["Accelerator", "Backend", "BatchingDecoder", "CalibrationSet", "Decoder", "Decoders", "FreeMemory",
           "GenerationOptions", "NativeDecoder", "NativeStep", "Needs", "OpTime", "PagingLimit", "Placement",
           "Probe", "Problem", "Profile", "Progress", "Schedule", "Scheme", "Session", "StepDecoder", "TensorSpec",
           "Tensors", "Vocabulary", "__version__", "cache", "current_rss_bytes", "hookimpl", "known_schemes",
           "latency_stats", "native_output", "normalize_scheme", "peak_rss_bytes", "reset_peak_rss", "seal",
           "stamp", "validate_feeds", "validate_outputs", "verbose"]


#: loaded on first use (``edgeinfer plan`` needs none of them): name -> the contract module that defines it
_LAZY = {"cache": None, "seal": None, "GenerationOptions": "generation", "native_output": "native_output",
        **{n: "decoder" for n in ("BatchingDecoder", "Decoder", "NativeDecoder", "NativeStep", "StepDecoder",
                              "Vocabulary")}}


def __getattr__(name: str):  # noqa: ANN202
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"{__name__}.{_LAZY[name] or name}")
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value
