"""The core's memory check before a decoder loads: the backend reports what the device has free
(Backend.free_memory), the planner's arithmetic says what the decoder needs, the core refuses and says
what to change. The devices here are stand-ins for an absent NPU: only their free-memory fact is faked."""

from __future__ import annotations

import re

import pytest

from edgeinfer.contract import Backend, Decoders, FreeMemory, normalize_scheme
from edgeinfer.errors import InputError
from edgeinfer.planning.device_memory import check_decoder_fits, shortfall
from edgeinfer.testing.llm import model_dir

GIB, MIB = 2**30, 2**20


class StandInNpuBackend(Backend):
    """A backend whose (absent) NPU reports ``free`` bytes free; nothing is ever loaded on it."""

    name = "standin-npu"
    decoders = Decoders(schemes=("fp16", "bf16", "fp32", "w8a16"))

    def __init__(self, free: FreeMemory | None):
        self.free = free
        self.asked: list[str | None] = []

    def free_memory(self, device: str | None) -> FreeMemory | None:
        self.asked.append(device)
        return self.free


def test_shortfall_says_what_to_change() -> None:
    # npu-smi's 910B4 chip 0: 26838 / 32768 MB used
    free = FreeMemory((32768 - 26838) * MIB, "NPU 0 chip 0 (910B4)", used_bytes=26838 * MIB, runtime="torch-npu")
    need = {"weights": 4 * GIB, "kv_cache": 2 * GIB, "workspace": 512 * MIB}  # 6656 MiB > 5930 MiB free
    message, fix = shortfall(free, need, context=4096, slots=2, scheme=normalize_scheme("fp16"), smaller=["w8a16"])
    assert message == ("NPU 0 chip 0 (910B4) has 5.79 GiB free (26838 MB used) but the decoder needs 6.50 GiB "
                       "(weights 4.00 + kv cache 2.00 + workspace 0.50 GiB)")
    # short by 726 MiB of a 2048 MiB cache at 4096 positions: 4096 * 1322 / 2048 = 2644 positions fit
    assert fix == ("use --ctx 2644 or less; or fewer slots than 2; or scheme w8a16 (fewer bits per weight); "
                   "or free the device (26838 MB already in use); or a device with more memory")
    assert shortfall(free, {"weights": 5 * GIB}, context=4096, slots=1, scheme=normalize_scheme("fp16"),
                     smaller=[]) is None


def test_a_decoder_that_does_not_fit_is_refused_with_the_largest_context_that_fits() -> None:
    free = FreeMemory(int(3.33 * GIB), "NPU 1 chip 0 (910B4)", used_bytes=29356 * MIB, runtime="torch-npu")
    be = StandInNpuBackend(free)
    check_decoder_fits(be, model_dir(), "npu:0", 4096, 1)  # a few MB: fits
    assert be.asked == ["npu:0"]
    with pytest.raises(InputError, match=r"NPU 1 chip 0 \(910B4\) has 3.33 GiB free") as e:
        check_decoder_fits(be, model_dir(), "npu:0", 2_000_000, 1)
    assert "scheme w8a16 (fewer bits per weight)" in e.value.hint  # fp16, the backend's preferred, was planned
    # the context it suggests is the largest that fits: that one passes, one more does not
    fit = int(re.search(r"--ctx (\d+) or less", e.value.hint).group(1))
    check_decoder_fits(be, model_dir(), "npu:0", fit, 1)
    with pytest.raises(InputError, match="GiB free"):
        check_decoder_fits(be, model_dir(), "npu:0", fit + 1, 1)
    with pytest.raises(InputError, match="GiB free"):  # fp32 weights and KV cache: more bytes than fp16's
        check_decoder_fits(be, model_dir(), "npu:0", fit, 1, scheme="fp32")


def test_no_fact_no_check() -> None:
    be = StandInNpuBackend(None)
    check_decoder_fits(be, model_dir(), None, 10**9, 64)  # nothing known about the device: the backend decides
    assert be.asked == [None]


def test_load_generator_checks_before_the_backend_loads(monkeypatch) -> None:
    from edgeinfer.contract import registry
    from edgeinfer.run.loading import load_generator

    be = registry.get_backend("transformers")
    monkeypatch.setattr(type(be), "free_memory", lambda self, device: FreeMemory(MIB, "a stand-in NPU"))

    def never(*args, **kwargs):
        raise AssertionError("the decoder was loaded although it does not fit")

    monkeypatch.setattr(type(be), "open_decoder", never)
    with pytest.raises(InputError, match="a stand-in NPU has 0.00 GiB free"):
        load_generator(model_dir(), backend="transformers", ctx=64)
