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
             "host": range(3000, 3100)}
FILES = sorted(DATA.glob("rows_*.yaml"))


def _rows(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))["rows"]


def _problems(row: dict, vendor: str) -> list[str]:
    where = f"row {row.get('row')}"
    measurements.check_row(row, where)  # raises on unknown fields, bad numbers, prompt > ctx
    out = []
    if row.get("row") not in ID_RANGES.get(vendor, ()):
        out.append(f"{where}: id outside the {vendor} range")
    if not str(row.get("source", "")).startswith("https://") or not row.get("source_id"):
        out.append(f"{where}: needs a public source URL and a source_id")
    if row.get("grade") not in {"A", "B", "C", "D"} or not isinstance(row.get("fit"), bool):
        out.append(f"{where}: grade A-D and fit true/false")
    board = get_board(row["board"])
    runtime = board.runtimes.get(row["runtime"])
    if runtime is None:
        return out + [f"{where}: {row['board']} has no runtime {row['runtime']}"]
    if normalize_scheme(row["quant"]).name not in runtime.schemes:
        out.append(f"{where}: {row['runtime']} on {row['board']} does not list {row['quant']}")
    if from_catalog(row["model"]) is None:
        out.append(f"{where}: {row['model']} is not in the catalog")
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
