"""Device selection, fallback detection and diagnosis: pure functions, fed with the device list the
real ``openvino.Core`` reports here, and with recorded stand-ins for hardware this machine lacks."""

import openvino as ov
import pytest
from edgeinfer_openvino.device import cpu_model_name, diagnose, fallback_warning, requested_primary, select_device

from edgeinfer.errors import BackendUnavailableError, InputError

REAL = list(ov.Core().available_devices)  # ['CPU'] on the CI machines
# Device lists of machines that are not here (stand-ins, recorded from OpenVINO docs' examples)
RECORDED_CORE_ULTRA_DEVICES_standin = ["CPU", "GPU", "NPU"]
RECORDED_TWO_GPUS_standin = ["CPU", "GPU.0", "GPU.1"]
RECORDED_CPUINFO_CORE_ULTRA_standin = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 170\n"
    "model name\t: Intel(R) Core(TM) Ultra 7 155H\nstepping\t: 4\n"
)


def test_real_core_lists_cpu():
    assert "CPU" in REAL


def test_auto_on_the_real_device_list_picks_the_best_present():
    want = "NPU" if "NPU" in REAL else ("GPU" if any(d.startswith("GPU") for d in REAL) else "CPU")
    assert select_device("auto", REAL).split(".")[0] == want
    assert select_device(None, REAL) == select_device("auto", REAL) == select_device("", REAL)


@pytest.mark.parametrize(
    "devices,want",
    [
        (RECORDED_CORE_ULTRA_DEVICES_standin, "NPU"),
        (["GPU", "CPU"], "GPU"),
        (RECORDED_TWO_GPUS_standin, "GPU.0"),
        (["CPU"], "CPU"),
        (["CPU", "NPU"], "NPU"),
    ],
)
def test_auto_preference_npu_gpu_cpu(devices, want):
    assert select_device("auto", devices) == want


def test_plain_names_are_case_insensitive_and_must_be_present():
    assert select_device("cpu", REAL) == "CPU"
    assert select_device("gpu.1", RECORDED_TWO_GPUS_standin) == "GPU.1"
    assert select_device("GPU", RECORDED_TWO_GPUS_standin) == "GPU"  # OpenVINO's alias of GPU.0


def test_unknown_device_is_an_input_error_naming_it():
    with pytest.raises(InputError, match="'FOO'") as err:
        select_device("FOO", REAL)
    assert err.value.exit_code == 2
    assert "CPU, GPU, NPU, auto" in str(err.value)


def test_absent_npu_is_unavailable_with_the_driver_fix():
    with pytest.raises(BackendUnavailableError, match="NPU is not available") as err:
        select_device("NPU", ["CPU"])
    assert "linux-npu-driver" in str(err.value)
    assert err.value.exit_code == 3


def test_absent_gpu_index_suggests_the_present_ones():
    with pytest.raises(BackendUnavailableError, match="GPU.2"):
        select_device("GPU.2", RECORDED_TWO_GPUS_standin)


def test_virtual_devices_pass_through_when_one_listed_device_is_here():
    assert select_device("auto:npu,cpu", REAL) == "AUTO:NPU,CPU"
    assert select_device("HETERO:NPU,CPU", ["CPU"]) == "HETERO:NPU,CPU"
    with pytest.raises(BackendUnavailableError):
        select_device("AUTO:NPU,GPU", ["CPU"])
    with pytest.raises(InputError, match="'TPU'"):
        select_device("AUTO:TPU,CPU", ["CPU"])
    with pytest.raises(InputError, match="unknown OpenVINO device"):
        select_device("BATCH:CPU", ["CPU"])


def test_requested_primary():
    assert requested_primary("AUTO:NPU,CPU") == "NPU"
    assert requested_primary("GPU.1") == "GPU"
    assert requested_primary("CPU") == "CPU"


def test_fallback_warning_when_npu_was_asked_but_cpu_executes():
    msg = fallback_warning("AUTO:NPU,CPU", ["CPU"])
    assert msg and "NPU" in msg and "CPU" in msg and "linux-npu-driver" in msg
    assert fallback_warning("AUTO:NPU,CPU", ["NPU"]) is None
    assert fallback_warning("AUTO:NPU,CPU", ["CPU", "NPU"]) is None  # AUTO's CPU warm-up while the NPU compiles
    assert fallback_warning("CPU", ["CPU"]) is None
    assert fallback_warning("GPU.1", ["GPU.1"]) is None
    assert fallback_warning("NPU", []) is None  # nothing reported: nothing to claim
    # AUTO reports its devices in parentheses: ['(CPU)']
    assert "executes the model on CPU;" in fallback_warning("AUTO:NPU,CPU", ["(CPU)"])
    assert fallback_warning("AUTO:NPU,CPU", ["(NPU)"]) is None


def test_cpuinfo_model_name():
    assert cpu_model_name(RECORDED_CPUINFO_CORE_ULTRA_standin) == "Intel(R) Core(TM) Ultra 7 155H"
    assert cpu_model_name("") == ""


def test_core_ultra_without_npu_device_says_install_the_driver():
    probs = diagnose(cpu_model_name(RECORDED_CPUINFO_CORE_ULTRA_standin), ["CPU", "GPU"], [])
    assert len(probs) == 1
    assert "Core(TM) Ultra 7 155H" in probs[0].message and "no NPU" in probs[0].message
    assert "linux-npu-driver" in probs[0].fix


def test_core_ultra_with_accel_node_but_no_npu_device_points_at_user_space_and_permissions():
    probs = diagnose("Intel(R) Core(TM) Ultra 7 155H", ["CPU"], ["/dev/accel/accel0"])
    assert len(probs) == 1 and "/dev/accel/accel0" in probs[0].message
    assert "render" in probs[0].fix and "level-zero" in probs[0].fix


def test_no_problem_when_the_npu_is_seen_or_the_cpu_has_none():
    assert diagnose("Intel(R) Core(TM) Ultra 7 155H", RECORDED_CORE_ULTRA_DEVICES_standin, []) == []
    assert diagnose("AMD EPYC", REAL, []) == []
    assert diagnose("", [], [])[0].message.startswith("OpenVINO reports no devices")
