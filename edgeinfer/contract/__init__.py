"""What a backend plugin imports: the hook specs, the Backend and Session base classes, tensor
specs, stamps and the plugin registry. See docs/writing-a-backend.md for the whole contract."""

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
from edgeinfer.contract.decoder import Decoder, NativeStep
from edgeinfer.contract.hookspecs import hookimpl
from edgeinfer.contract.resources import Accelerator

__all__ = ["Accelerator", "Backend", "CalibrationSet", "Decoder", "NativeStep", "OpTime", "Probe", "Problem",
           "Profile", "Session", "TensorSpec", "hookimpl", "stamp", "validate_feeds"]
