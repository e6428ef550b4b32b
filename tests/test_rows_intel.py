"""bench/data/rows_intel.yaml beyond what every rows file is checked for (tests/test_published_rows.py): Intel's
table rows cite the blob URL (with commit) of the table and the part it was measured on, decode is the quoted
latency's inverse, calibrate reads the file, and the NPU rows follow their rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from edgeinfer.planning.measurements import load

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
ROWS = yaml.safe_load((DATA / "rows_intel.yaml").read_text(encoding="utf-8"))["rows"]
TABLES = [r for r in ROWS if r["source_id"].startswith("openvino-llm-tables/")]  # Intel's own, grade A
BLOB = re.compile(r"^https://github\.com/openvinotoolkit/openvino/blob/[0-9a-f]{40}/docs/sphinx_setup/_static/"
                  r"benchmarks_files/llm_models_(?P<platform>[0-9]-[0-9]{3}[HV])\.csv$")


def test_ids_are_in_the_intel_range_and_unique_across_the_rows_files():
    ids = [r["row"] for r in ROWS]
    assert len(TABLES) > 100 and len(set(ids)) == len(ids) and all(1000 <= i <= 1999 for i in ids)
    others = [r["row"] for f in sorted(DATA.glob("*.yaml")) if f.name != "rows_intel.yaml"
              for r in yaml.safe_load(f.read_text(encoding="utf-8")).get("rows", [])]
    assert not set(ids) & set(others)


def _table_row_problems(row: dict) -> list[str]:
    m = BLOB.match(row["source"])
    ok = (row["grade"] == "A" and row["runtime"] == "openvino-gpu" and row["ttft_ms"] > 0 and m is not None
          and row["source_id"] == f"openvino-llm-tables/{m['platform']}"
          # the board is the part the table was measured on: "7-258V" -> core-ultra-258v
          and row["board"] == f"core-ultra-{m['platform'][2:].lower()}"
          and ((row["mem_mib"] > 0) if "mem_mib" in row else "memory left out" in row["note"]))
    return [] if ok else [f"row {row['row']}"]


def test_every_intel_table_row_cites_its_table_and_part():
    assert [p for r in TABLES for p in _table_row_problems(r)] == []


def test_decode_is_the_inverse_of_the_quoted_second_token_latency():
    for r in TABLES:
        latency = float(re.search(r"2nd latency ([0-9.]+) ms", r["note"])[1])
        assert r["decode"] == pytest.approx(1000 / latency, abs=0.006)


def test_calibrate_reads_the_file_and_skips_the_rows_marked_not_to_fit():
    rows, notes = load([DATA / "rows_intel.yaml"])
    skipped = [r["row"] for r in ROWS if r["fit"] is False]
    assert len(rows) == len(ROWS) - len(skipped) and len(notes) == len(skipped) > 0
    assert {r["source_id"] for r in rows} >= {"openvino-llm-tables/7-258V", "OpenArc#43"}


def test_every_npu_row_records_its_release_and_fits_only_a_decode_rate():
    """openvino-npu rows: the rule in rows_intel.yaml's header (release recorded; end-to-end rates not fitted)."""
    npu = [r for r in ROWS if r["runtime"] == "openvino-npu"]
    assert len(npu) >= 7 and all(r.get("runtime_version") for r in npu)
    for r in npu:
        if "end-to-end" in r["note"] and "Validation only" in r["note"]:
            assert r["fit"] is False, r["row"]
    small = {r["board"] for r in npu if r["fit"] and r["model"] == "qwen3-0.6b"}
    large = {r["board"] for r in npu if r["fit"] and r["model"] == "qwen3-8b"}
    assert small & large  # one NPU 3 part with a 0.6B and an 8B row: what fitting t0 needs
