"""Off a terminal (a pipe, a log; stdout is not a tty in-process here) tables and lines keep their whole width:
one board a line with all its runtimes, the plan header on one line."""

from __future__ import annotations

import json

import pytest

from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()


@pytest.fixture(autouse=True)
def no_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # COLUMNS, where set, is a width the user asked for


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("│")[1:-1]]


def test_boards_piped_is_one_line_per_board_with_every_runtime_in_it() -> None:
    boards = json.loads(cli("boards", "--json").stdout)["boards"]
    proc = cli("boards")
    assert proc.returncode == 0, proc.stderr
    rows = [cells(ln) for ln in proc.stdout.splitlines() if ln.startswith("│")]
    assert all(row[0] for row in rows), "a row continues on the next line"
    by_name = {row[0]: row for row in rows}
    assert len(rows) == len(boards) == len(by_name)
    for b in boards:
        row = by_name[b["name"]]
        assert b["family"] in row  # the wide layout, with the family column
        for runtime, schemes in b["runtimes"].items():
            assert f"{runtime}: {', '.join(schemes)}" in row[-1]
    assert not any(ln.endswith(" ") for ln in proc.stdout.splitlines())


def test_plan_piped_has_its_header_and_reasons_on_whole_lines() -> None:
    proc = cli("plan", "qwen3-4b", "--board", "rk3588-16g", "--quant", "w8a8")
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0]
    assert header.startswith("Qwen/Qwen3-4B on rk3588-16g (") and header.endswith(
        "): w8a8 via rknn, ctx 2048, batch 1, KV fp16: FITS"), header
    decode = [ln for ln in proc.stdout.splitlines() if ln.startswith("decode ≈ ")]
    assert len(decode) == 1 and decode[0].endswith(")")  # the whole basis on its line
    matrix = cli("plan", "qwen3-4b", "--board", "all", "--quant", "w8a8")
    rows = [cells(ln) for ln in matrix.stdout.splitlines() if ln.startswith("│")]
    assert rows and all(row[0] for row in rows), "a reason wrapped onto a second line"
    assert any("does not support w8a8 for decoder models" in row[1] for row in rows)


def test_plan_header_on_a_narrow_terminal_has_no_dangling_dash() -> None:
    proc = cli("plan", "qwen3-4b", "--board", "rk3588-16g", "--quant", "w8a8", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert not any(ln.rstrip().endswith("—") for ln in proc.stdout.splitlines()), proc.stdout
