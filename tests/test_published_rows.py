"""Every published row in bench/data/rows_<vendor>.yaml loads: fields as calibrate reads them, a board that exists,
a catalog model, a scheme the board's runtime lists, its own id range, a public source and a source_id."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgeinfer.contract.schemes import normalize_scheme
from edgeinfer.planning import measurements
from edgeinfer.planning.boards import get_board
from edgeinfer.planning.models import from_catalog

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"
ID_RANGES = {"rockchip": range(100, 300), "intel": range(1000, 2000), "ascend": range(2000, 3000),
             "host": range(3000, 3100), "host_llamacpp": range(3100, 3200),
             "host_openvino": range(3200, 3300)}
FILES = sorted(DATA.glob("rows_*.yaml"))


def _rows(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))["rows"]


def _problems(row: dict, vendor: str) -> list[str]:
    where = f"row {row.get('row')}"
    measurements.check_row(row, where)  # raises on unknown fields, bad numbers, prompt > ctx
    out = []
    if row.get("row") not in ID_RANGES.get(vendor, ()):
        out.append(f"{where}: id outside the {vendor} range")
    if vendor.startswith("host"):  # this project's own measurements: the bench script that made them, models inline
        script = str(row.get("source", "")).split(" ", 1)[0]
        if not (DATA.parent.parent / script).is_file() or not row.get("source_id"):
            out.append(f"{where}: needs the bench script that measured it as source, and a source_id")
    elif not str(row.get("source", "")).startswith("https://") or not row.get("source_id"):
        out.append(f"{where}: needs a public source URL and a source_id")
    if row.get("grade") not in {"A", "B", "C", "D"} or not isinstance(row.get("fit"), bool):
        out.append(f"{where}: grade A-D and fit true/false")
    board = get_board(row["board"])
    runtime = board.runtimes.get(row["runtime"])
    if runtime is None:
        return out + [f"{where}: {row['board']} has no runtime {row['runtime']}"]
    if normalize_scheme(row["quant"]).name not in runtime.schemes:
        out.append(f"{where}: {row['runtime']} on {row['board']} does not list {row['quant']}")
    spec = from_catalog(row["model"])
    if spec is None and not isinstance(row.get("model_config"), dict):
        out.append(f"{where}: {row['model']} is not in the catalog")
    elif spec is not None and spec.max_position and row["ctx"] > spec.max_position:
        out.append(f"{where}: ctx {row['ctx']} exceeds {row['model']}'s {spec.max_position} positions")
    return out


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_published_row_loads(path: Path) -> None:
    vendor = path.stem.removeprefix("rows_")
    rows = _rows(path)
    assert rows
    assert [p for r in rows for p in _problems(r, vendor)] == []


def test_row_ids_are_unique_across_the_rows_files() -> None:
    ids = [r["row"] for p in FILES for r in _rows(p)]
    old = {r["row"] for r in _rows(DATA / "measured_rows.yaml")}
    assert len(ids) == len(set(ids))
    assert not set(ids) & old


def test_the_check_catches_a_scheme_the_runtime_does_not_list() -> None:
    row = {"row": 2999, "grade": "C", "board": "atlas-300i-pro", "runtime": "vllm-ascend", "model": "qwen3-8b",
           "quant": "bf16", "ctx": 512, "decode": 2.0, "fit": False, "source": "https://example.org/x",
           "source_id": "x"}
    assert _problems(row, "ascend") == ["row 2999: vllm-ascend on atlas-300i-pro does not list bf16"]
    assert _problems({**row, "quant": "fp16", "row": 5}, "ascend") == ["row 5: id outside the ascend range"]


def _ascend_rows() -> list[dict]:
    old = [r for r in _rows(DATA / "measured_rows.yaml") if get_board(r["board"]).backend == "ascend"]
    return old + _rows(DATA / "rows_ascend.yaml")


def test_every_ascend_row_states_its_runtime_release() -> None:
    assert [r["row"] for r in _ascend_rows() if not r.get("runtime_version")] == []


def test_a_fitted_ascend_row_is_a_one_chip_figure() -> None:
    """Rule 1 of the rows_ascend.yaml header: a fitted row ran on one chip, so its weights fit that chip's usable
    memory (rows 32 and 2008, 61 GB of Qwen3-30B-A3B fp16 on 30 GB 910B4s, did not: layers split over chips)."""
    import importlib.util

    path = DATA.parent / "fit_speed.py"
    spec = importlib.util.spec_from_file_location("_bench_fit_speed", path)
    fit_speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_speed)
    too_big = []
    for r in _ascend_rows():
        weights_mib = fit_speed.planned_mib(r, fit_speed.row_facts(r))["weights"]
        if weights_mib * 2**20 > get_board(r["board"]).usable_bytes:
            too_big.append((r["row"], r["fit"]))
    assert too_big and all(not fit for _, fit in too_big), too_big
