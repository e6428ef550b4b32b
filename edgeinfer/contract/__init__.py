"""What a backend plugin imports: the hook specs, the Backend and Session base classes, the decoder
base classes, the records a backend declares and answers, tensor specs, stamps and the plugin registry.
See docs/writing-a-backend.md for the whole contract."""

from edgeinfer.contract import stamp
from edgeinfer.contract.backend import (
    Backend,
    CalibrationSet,
    OpTime,
    Probe,
    Problem,
    Profile,
    Session,
    TensorSpec,
    validate_feeds,
)
from edgeinfer.contract.decoder import BatchingDecoder, Decoder, NativeDecoder, NativeStep, StepDecoder
from edgeinfer.contract.hookspecs import hookimpl
from edgeinfer.contract.records import Decoders, PagingLimit, Placement, Tensors
from edgeinfer.contract.resources import Accelerator

__all__ = ["Accelerator", "Backend", "BatchingDecoder", "CalibrationSet", "Decoder", "Decoders", "NativeDecoder",
           "NativeStep", "OpTime", "PagingLimit", "Placement", "Probe", "Problem", "Profile", "Session",
           "StepDecoder", "TensorSpec", "Tensors", "hookimpl", "stamp", "validate_feeds"]
