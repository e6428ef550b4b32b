"""Board profiles: schema, stable names, sources, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgeinfer.errors import BoardError
from edgeinfer.planning.boards import Board, get_board, host_board, load_boards

STABLE = ["rk3588-4g", "rk3588-8g", "rk3588-16g", "rk3588-32g", "rk3576-4g", "rk3576-8g", "rk3576-16g",
          "atlas-300i-pro", "atlas-300i-duo-48g", "atlas-300i-duo-96g", "atlas-800i-a2", "atlas-300i-a2-910b4",
          "atlas-200i-dk-a2", "orange-pi-aipro-8g", "orange-pi-aipro-16g", "core-ultra-155h", "core-ultra-185h",
          "core-ultra-258v", "core-ultra-288v", "core-ultra-285h", "atlas-800t-a2-910b2", "atlas-800t-a2-910b3",
          "core-ultra-125h", "core-ultra-165h", "core-ultra-255h", "core-ultra-268v", "core-ultra-338h",
          "core-ultra-358h", "core-ultra-368h", "core-ultra-285k"]


def test_stable_names_present():
    boards = load_boards(plugins=False)
    assert set(STABLE) <= set(boards)
    assert get_board("host").name == "host"


@pytest.mark.parametrize("name", STABLE)
def test_every_fact_has_a_source(name):
    b = get_board(name)
    for field in ("memory_total_gib", "os_reserve_gib", "bandwidth_gbps", "int8_tops", "fp16_tflops",
                  "storage_gbps", "npu_window_gib"):
        f = getattr(b, field)
        if f is not None:
            assert len(f.source) > 10, (name, field)
    assert b.usable_bytes < b.total_bytes
    assert b.default_runtime in b.runtimes


def test_published_facts():
    b = get_board("rk3588-16g")
    assert b.memory_total_gib.value == 16 and b.npu_window_gib.value == 4  # rknn-llm #232
    assert b.bandwidth_gbps.value == pytest.approx(64 / 8 * 4.224, rel=0.01)  # 64-bit × 4224 MT/s
    assert "w4a16" not in b.supported_schemes("rkllm")
    assert "w4a16" in get_board("rk3576-8g").supported_schemes("rkllm")
    assert get_board("atlas-300i-a2-910b4").memory_total_gib.value == 32
    assert get_board("atlas-800i-a2").memory_total_gib.value == 64
    assert get_board("atlas-200i-dk-a2").bandwidth_gbps.value == pytest.approx(3.2 * 64 / 8)  # 3200 Mbps × 64 bit
    assert get_board("rk3588-8g").backend == "rknn" and get_board("core-ultra-258v").backend == "openvino"
    assert get_board("atlas-300i-pro").backend == "ascend" and get_board("orange-pi-aipro-8g").backend == "ascend"


def test_910b_boards_share_one_speed_group_and_the_800i_a2_runs_mindie():
    boards = [get_board(n) for n in ("atlas-300i-a2-910b4", "atlas-800i-a2", "atlas-800t-a2-910b2",
                                     "atlas-800t-a2-910b3")]
    assert [b.memory_total_gib.value for b in boards] == [32, 64, 64, 64]  # npu-smi 65536 MB on 910B2/B3/B4-1
    for b in boards:
        assert {rt.speed_group for name, rt in b.runtimes.items()} == {"ascend-910b"}, b.name
    a2 = get_board("atlas-800i-a2")
    assert "910B4" in a2.title and {"fp16", "w8a8"} <= set(a2.supported_schemes("mindie"))
    assert "mindie" not in get_board("atlas-800t-a2-910b2").runtimes  # MindIE lists the 800I A2, not the 800T


def test_host_board_reads_meminfo(monkeypatch):
    monkeypatch.setenv("EDGEINFER_HOST_BANDWIDTH_GBPS", "7.5")  # the measured figure: tests/test_host_board.py
    with open("/proc/meminfo") as f:
        total_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    h = host_board()
    assert h.total_bytes == pytest.approx(total_kib * 1024, rel=1e-6)
    assert h.bandwidth_gbps.value == 7.5 and h.bandwidth_gbps.uncertain
    assert h.runtimes[h.default_runtime].speed_group == "host-cpu"


def _profile(**over):
    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "boards" / "rk3588-8g.yaml").read_text())
    d.update(over)
    return d


def test_user_board_file(tmp_path):
    d = _profile(name="my-board", memory_total_gib={"value": 12, "source": "my datasheet"})
    p = tmp_path / "my-board.yaml"
    p.write_text(yaml.safe_dump(d))
    b = get_board(str(p))
    assert b.name == "my-board" and b.total_bytes == 12 * 2**30


def test_unknown_key_names_file_and_key(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(_profile(memroy_total_gib=3)))
    with pytest.raises(BoardError) as e:
        get_board(str(p))
    assert str(p) in e.value.one_line() and "memroy_total_gib" in e.value.one_line()
    assert e.value.exit_code == 2


def test_missing_key_names_it(tmp_path):
    d = _profile()
    del d["bandwidth_gbps"], d["os_reserve_gib"]
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(BoardError) as e:
        get_board(str(p))
    assert "os_reserve_gib" in e.value.one_line()


def test_fact_without_source_is_rejected(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(_profile(bandwidth_gbps={"value": 30})))
    with pytest.raises(BoardError, match="bandwidth_gbps.source"):
        get_board(str(p))


def test_unknown_board_lists_closest():
    with pytest.raises(BoardError) as e:
        get_board("rk3588-16")
    assert "rk3588-16g" in e.value.one_line() and e.value.exit_code == 2


def test_extra_boards_override():
    d = _profile(name="lab-board")
    b = Board.model_validate(d)
    assert get_board("lab-board", extra=[b]).name == "lab-board"
    assert "lab-board" in load_boards(extra=[d], plugins=False)


def test_plugin_boards_through_the_registry(monkeypatch):
    from edgeinfer.contract import registry as plugins

    reg = plugins.registry()
    reg.boards()  # discover first, then add one as a plugin's register_boards would
    d = _profile(name="plugin-npu-8g", family="plugin-npu")
    monkeypatch.setattr(reg, "_boards", [*reg.boards(), (d, None)])
    assert get_board("plugin-npu-8g").name == "plugin-npu-8g"
    assert "plugin-npu-8g" in load_boards()


def test_broken_plugin_board_is_isolated(monkeypatch):
    from edgeinfer.contract import registry as plugins
    from edgeinfer.planning import boards

    reg = plugins.registry()
    monkeypatch.setattr(reg, "_boards", [*reg.boards(), ({"name": "broken", "bogus": 1}, None)])
    names = load_boards()
    assert "rk3588-16g" in names and "broken" not in names
    assert any("bogus" in e for e in boards.PLUGIN_BOARD_ERRORS)


# the NPU and iGPU generation of each Core Ultra profile (docs/board-facts.md#intel-npu-dtypes, #intel-igpu)
CORE_ULTRA = {"core-ultra-125h": ("intel-npu3", "intel-xe-lpg"), "core-ultra-155h": ("intel-npu3", "intel-xe-lpg"),
              "core-ultra-165h": ("intel-npu3", "intel-xe-lpg"), "core-ultra-185h": ("intel-npu3", "intel-xe-lpg"),
              "core-ultra-255h": ("intel-npu3", "intel-xe-lpg-plus"),
              "core-ultra-285h": ("intel-npu3", "intel-xe-lpg-plus"),
              "core-ultra-285k": ("intel-npu3", "intel-xe-lpg"),
              "core-ultra-258v": ("intel-npu4", "intel-xe2"), "core-ultra-268v": ("intel-npu4", "intel-xe2"),
              "core-ultra-288v": ("intel-npu4", "intel-xe2"), "core-ultra-338h": ("intel-npu5", "intel-xe3"),
              "core-ultra-358h": ("intel-npu5", "intel-xe3"), "core-ultra-368h": ("intel-npu5", "intel-xe3")}


def test_every_core_ultra_profile_has_the_npu_first_the_igpu_by_generation_and_the_cpu():
    packaged = {n for n in load_boards(plugins=False) if n.startswith("core-ultra-")}
    assert packaged == set(CORE_ULTRA)
    for name, (npu, gpu) in CORE_ULTRA.items():
        b = get_board(name)
        assert (b.default_runtime, b.backend_runtime, b.target) == ("openvino-npu", "openvino-npu", "npu")
        assert list(b.runtimes) == ["openvino-npu", "openvino-gpu", "openvino-cpu"]
        assert b.runtimes["openvino-cpu"].schemes == ["fp32", "fp16", "w8a16"]
        assert b.runtimes["openvino-cpu"].speed_group is None  # no Core Ultra CPU measured: no speed estimate
        assert (b.runtimes["openvino-npu"].speed_group, b.runtimes["openvino-gpu"].speed_group) == (npu, gpu)
        assert b.runtimes["openvino-gpu"].schemes == ["w4a16", "w4a16_g128", "w8a16", "fp16"]
        assert "w8a8" not in b.runtimes["openvino-gpu"].schemes  # the iGPU rows are weight-only or fp16
