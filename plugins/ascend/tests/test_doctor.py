"""The environment doctor against recorded outputs (no Ascend hardware, CANN or npu-smi here).

Expected values below were read by hand from the fixture files (see fixtures/SOURCES.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from edgeinfer_ascend import doctor

FIXTURES = Path(__file__).parent / "fixtures"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_npu_smi_310p3_ddr_memory():
    info = doctor.parse_npu_smi_info(recorded("recorded_npu_smi_310p3_atlas300i_duo.txt"))
    assert info.version == "25.2.0"
    assert [(c.npu, c.chip, c.name, c.health) for c in info.chips] == [(2, 0, "310P3", "OK"), (2, 1, "310P3", "OK")]
    assert [(c.memory_used_mb, c.memory_total_mb, c.memory_kind) for c in info.chips] == [
        (1529, 44280, "DDR"),
        (1412, 43693, "DDR"),
    ]
    assert info.chips[0].power_w is None and info.chips[0].temp_c == 45 and info.chips[1].temp_c == 43
    assert info.chips[0].bus_id == "0000:01:00.0" and info.chips[0].aicore_pct == 0
    assert doctor.npu_smi_problems(info) == []


def test_npu_smi_910b4_hbm_without_space():
    info = doctor.parse_npu_smi_info(recorded("recorded_npu_smi_910b4.txt"))
    assert info.version == "24.1.1"
    assert [(c.npu, c.name, c.memory_used_mb, c.memory_total_mb, c.memory_kind) for c in info.chips] == [
        (0, "910B4", 26838, 32768, "HBM"),
        (1, "910B4", 29356, 32768, "HBM"),
    ]
    assert [c.power_w for c in info.chips] == [88.2, 87.0]
    assert [c.bus_id for c in info.chips] == ["0000:C1:00.0", "0000:C2:00.0"]


def test_npu_smi_a3_wide_layout_and_processes():
    info = doctor.parse_npu_smi_info(recorded("recorded_npu_smi_a3_ascend910_wide.txt"))
    assert info.version == "26.0.rc2"
    assert [(c.npu, c.chip, c.phy_id, c.name) for c in info.chips] == [(0, 0, 0, "Ascend910"), (0, 1, 1, "Ascend910")]
    assert [(c.memory_used_mb, c.memory_total_mb) for c in info.chips] == [(3419, 65536), (2874, 65536)]
    assert info.chips[0].power_w == 162.6 and info.chips[1].power_w is None  # "-" on the second die
    assert info.processes == [{"npu": 0, "chip": 0, "pid": "632268", "name": "python3.1", "memory_mb": 197.0}]


def test_unhealthy_chip_is_a_problem_with_a_fix():
    # synthetic: the recorded 910B4 table with one Health cell changed to an alarm state
    text = recorded("recorded_npu_smi_910b4.txt").replace("| 1     910B4               | OK  ",
                                                          "| 1     910B4               | Alarm")
    info = doctor.parse_npu_smi_info(text)
    assert [c.health for c in info.chips] == ["OK", "Alarm"]
    problems = doctor.npu_smi_problems(info)
    assert len(problems) == 1 and "NPU 1" in problems[0].message and "npu-smi" in problems[0].fix


def test_empty_npu_smi_output_is_a_problem():
    problems = doctor.npu_smi_problems(doctor.parse_npu_smi_info("npu-smi info: no device\n"))
    assert problems and "davinci" in problems[0].fix


def test_torch_npu_without_cann_recorded_failure():
    text = recorded("recorded_torch_npu_without_cann_import_torch.txt")
    problems = doctor.import_problems(text, cann_home=None)
    msgs = " ".join(p.message for p in problems)
    fixes = " ".join(p.fix for p in problems)
    assert "import torch" in msgs and "libhccl.so" in msgs
    assert "pip uninstall torch_npu" in fixes and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in fixes
    assert "set_env.sh" in fixes


def test_toolkit_from_env_and_version_file(tmp_path):
    home = tmp_path / "ascend-toolkit" / "8.3.RC1"
    (home / "aarch64-linux").mkdir(parents=True)
    info = recorded("recorded_ascend_toolkit_install.info")
    (home / "aarch64-linux" / "ascend_toolkit_install.info").write_text(info)
    libdir = home / "lib64"
    libdir.mkdir()
    env = {"ASCEND_TOOLKIT_HOME": str(home), "LD_LIBRARY_PATH": "/usr/lib"}
    tk = doctor.find_toolkit(env, arch="aarch64")
    assert tk.version == "8.3.RC1" and tk.found_by == "env:ASCEND_TOOLKIT_HOME"
    problems = doctor.toolkit_problems(tk, npu_present=True)
    assert len(problems) == 1 and "libascendcl.so" in problems[0].message and "set_env.sh" in problems[0].fix
    # after `source set_env.sh` the libraries are on LD_LIBRARY_PATH
    for lib in ("libascendcl.so", "libhccl.so"):
        (libdir / lib).write_bytes(b"")
    tk = doctor.find_toolkit(dict(env, LD_LIBRARY_PATH=f"/usr/lib:{libdir}"), arch="aarch64")
    assert doctor.toolkit_problems(tk, npu_present=True) == []


def test_no_toolkit_with_npu_present_says_install_cann(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "DEFAULT_TOOLKIT_HOMES", (str(tmp_path / "nothing"),))
    tk = doctor.find_toolkit({}, arch="x86_64")
    assert tk.home is None
    problems = doctor.toolkit_problems(tk, npu_present=True)
    assert problems and "CANN" in problems[0].message and "set_env.sh" in problems[0].fix
    assert doctor.toolkit_problems(tk, npu_present=False) == []


def test_versions_against_the_official_table():
    # torch_npu 2.6.0.post3 is the CANN 8.3.RC1 build; with CANN 8.5.0 the matching build is 2.6.0.post5
    problems = doctor.version_problems("2.6.0", "2.6.0.post3", "8.5.0")
    assert len(problems) == 1
    assert "8.3.RC1" in problems[0].message and "torch_npu==2.6.0.post5" in problems[0].fix
    assert doctor.compat_status("2.6.0.post3", "8.5.0") == "mismatch"
    assert doctor.version_problems("2.6.0", "2.6.0.post3", "8.3.RC1") == []
    assert doctor.compat_status("2.6.0.post3", "CANN 8.3.RC1") == "matches"
    # torch and torch_npu must share the release: name the pair
    problems = doctor.version_problems("2.13.0+cpu", "2.12.0", None)
    assert len(problems) == 1 and "torch==2.12.0" in problems[0].fix and "torch_npu==2.13.0" in problems[0].fix
    # newer than the recorded table: not an error, reported as such
    assert doctor.version_problems("2.13.0", "2.13.0", "9.1.0") == []
    assert doctor.compat_status("2.13.0", "9.1.0") == "not in table"
    table = doctor.compat_table()
    assert table["source_url"].startswith("https://github.com/Ascend/pytorch/")


def _fake_npu_smi_standin(bin_dir: Path, fixture: str) -> None:
    """A stand-in for the absent `npu-smi` binary: prints a recorded output."""
    exe = bin_dir / "npu-smi"
    exe.write_text(f"#!/bin/sh\ncat '{FIXTURES / fixture}'\n")
    exe.chmod(0o755)


def test_probe_parses_npu_smi_through_the_device_module(tmp_path, monkeypatch, ascend):
    _fake_npu_smi_standin(tmp_path, "recorded_npu_smi_910b4.txt")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    p = ascend.probe()
    assert p.available and "cpu" in p.devices
    assert p.versions["npu-smi"] == "24.1.1"
    assert [c["memory_total_mb"] for c in p.details["npu_smi"]["chips"]] == [32768, 32768]
    # an NPU is listed but no CANN/torch_npu: the doctor says what to install
    assert p.details["cann_toolkit"]["home"] is None  # no CANN on the test machines
    assert any("CANN toolkit not found" in pr.message and "set_env.sh" in pr.fix for pr in p.problems)


def test_probe_without_any_ascend_software_is_cpu_and_clean(ascend, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    p = ascend.probe()
    assert p.available and p.devices == ["cpu"]
    assert p.details["mode"].startswith("cpu (no Ascend")
    json.dumps(p.to_json())


STANDIN_TORCH_NPU = '''
raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
'''


@pytest.fixture(scope="module")
def fake_torch_npu_standin(tmp_path_factory):
    """A stand-in torch_npu distribution that fails like the real one without CANN: a package whose
    import raises the recorded ImportError, registered in torch's ``torch.backends`` entry-point
    group exactly like the real wheel, so real torch's auto-loading trips over it."""
    root = tmp_path_factory.mktemp("fake-torch-npu-standin")
    (root / "torch_npu").mkdir()
    (root / "torch_npu" / "__init__.py").write_text(STANDIN_TORCH_NPU)
    info = root / "torch_npu-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return root


def _run(code: str, pythonpath: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pythonpath), PATH="/usr/bin:/bin")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_standin_reproduces_the_real_failure(fake_torch_npu_standin):
    proc = _run("import torch", fake_torch_npu_standin)
    assert proc.returncode != 0
    assert "Failed to load the backend extension: torch_npu" in proc.stderr  # real torch's own message
    real = recorded("recorded_torch_npu_without_cann_import_torch.txt")
    assert "Failed to load the backend extension: torch_npu" in real and "libhccl.so" in real


@pytest.mark.slow
def test_doctor_and_cpu_path_survive_a_broken_torch_npu(fake_torch_npu_standin):
    code = """
    import json, numpy as np, edgeinfer
    be = edgeinfer.backend("ascend")
    p = be.probe()
    from edgeinfer_ascend import device
    torch = device.import_torch()       # must not raise: autoload switched off for this process
    print(json.dumps({"available": p.available, "devices": p.devices,
                      "problems": [[x.message, x.fix] for x in p.problems],
                      "versions": p.versions, "sum": float(torch.ones(3).sum())}))
    """
    proc = _run(code, fake_torch_npu_standin)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["available"] and out["devices"] == ["cpu"] and out["sum"] == 3.0
    assert out["versions"]["torch_npu"] == "2.13.0"
    text = json.dumps(out["problems"])
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in text and "pip uninstall torch_npu" in text and "libhccl.so" in text


# --- device memory vs the decoder's plan ----------------------------------------------------


def test_memory_shortfall_says_what_to_change():
    info = doctor.parse_npu_smi_info(recorded("recorded_npu_smi_910b4.txt"))  # chip 0: 26838 / 32768 MB used
    gib, mib = 2**30, 2**20
    need = {"weights": 4 * gib, "kv_cache": 2 * gib, "workspace": 512 * mib}  # 6656 MiB > 5930 MiB free
    [p] = doctor.memory_problems(info, 0, need, context=4096, slots=1, scheme="fp16")
    assert "has 5.79 GiB free" in p.message and "needs 6.50 GiB" in p.message and "910B4" in p.message
    # short by 726 MiB of a 2048 MiB cache at 4096 positions: 4096 * 1322 / 2048 = 2644 positions fit
    assert "--ctx 2644 or less" in p.fix and "w8a16" in p.fix and "26838 MB already in use" in p.fix
    assert doctor.memory_problems(info, 0, {"weights": 5 * gib}, context=4096, slots=1, scheme="fp16") == []
    [missing] = doctor.memory_problems(info, 2, need, context=4096, slots=1, scheme="fp16")
    assert "2 NPU chip(s)" in missing.message


def test_decoder_memory_check_reads_npu_smi_through_the_device_module(tmp_path, monkeypatch):
    from edgeinfer_ascend import decoder_export

    from edgeinfer.errors import InputError
    from edgeinfer.testing.llm import model_dir

    _fake_npu_smi_standin(tmp_path, "recorded_npu_smi_910b4.txt")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1")  # npu:0 is the second card: 29356 / 32768 MB used
    decoder_export.check_device_memory(model_dir(), "fp16", "fp16", 4096, 1, "npu:0")  # a few MB: fits
    with pytest.raises(InputError, match=r"NPU 1 chip 0 \(910B4\) has 3.33 GiB free") as e:
        decoder_export.check_device_memory(model_dir(), "fp16", "fp16", 2_000_000, 1, "npu:0")
    # the context it suggests is the largest that fits: that one loads, one more does not
    fit = int(re.search(r"--ctx (\d+) or less", e.value.hint).group(1))
    decoder_export.check_device_memory(model_dir(), "fp16", "fp16", fit, 1, "npu:0")
    with pytest.raises(InputError, match="GiB free"):
        decoder_export.check_device_memory(model_dir(), "fp16", "fp16", fit + 1, 1, "npu:0")
