"""Progress off a terminal: a plain line every interval (step, item i/n, elapsed), nothing for a short step,
nothing at all with --quiet."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from edgeinfer.progress import Heartbeat, Progress
from edgeinfer.testing import models
from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()

PLAIN = re.compile(r"^(?P<step>.+?): (?:(?P<done>\d+)/(?P<total>\d+), )?(?P<s>[\d.]+) s elapsed$")


def plain_lines(err: str) -> list[re.Match]:
    return [m for m in map(PLAIN.match, err.splitlines()) if m]


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_line_names_the_step_the_item_and_the_time_elapsed() -> None:
    clock = FakeClock(112.4)
    beat = Heartbeat("golden check", 16, on=False, clock=clock)
    beat.t0, beat.done = 100.0, 3  # what entering the block at t=100 and three items done would set
    assert beat.line() == "golden check: 3/16, 12 s elapsed\n"
    clock.t = 104.25
    assert beat.line() == "golden check: 3/16, 4.2 s elapsed\n"
    beat = Heartbeat("converting to openvino w8a8 for npu", None, on=False, clock=clock)
    beat.t0 = 4.25
    assert beat.line() == "converting to openvino w8a8 for npu: 100 s elapsed\n"


def test_a_long_step_writes_plain_lines_and_its_duration(capfd, monkeypatch) -> None:
    monkeypatch.setenv("EDGEINFER_PROGRESS_INTERVAL", "0.02")
    monkeypatch.delenv("EDGEINFER_QUIET", raising=False)
    progress = Progress(enabled=False, plain=True)
    with progress.step("converting"):
        time.sleep(0.3)
    _, err = capfd.readouterr()
    lines = plain_lines(err)
    assert lines and all(m["step"] == "converting" for m in lines), err
    assert re.search(r"^converting: done in [\d.]+ s$", err, re.M), err


def test_a_loop_line_counts_items(capfd, monkeypatch) -> None:
    monkeypatch.setenv("EDGEINFER_PROGRESS_INTERVAL", "0.02")
    progress = Progress(enabled=False, plain=True)
    for _ in progress.track([1, 2, 3], "golden check"):
        time.sleep(0.1)
    _, err = capfd.readouterr()
    counted = [m for m in plain_lines(err) if m["step"] == "golden check"]
    assert counted and {m["total"] for m in counted} == {"3"}, err
    assert all(0 <= int(m["done"]) <= 3 for m in counted)


def test_short_steps_quiet_and_the_library_default_print_nothing(capfd, monkeypatch) -> None:
    monkeypatch.delenv("EDGEINFER_PROGRESS_INTERVAL", raising=False)
    with Progress(enabled=False, plain=True).step("planning"):
        pass  # far below the default 10 s
    monkeypatch.setenv("EDGEINFER_PROGRESS_INTERVAL", "0.01")
    with Progress(enabled=False).step("library call"):  # what deploy() uses without a command's progress
        time.sleep(0.1)
    monkeypatch.setenv("EDGEINFER_QUIET", "1")
    quiet = Progress.for_command()
    assert not quiet.enabled and not quiet.plain
    with quiet.step("converting"):
        time.sleep(0.1)
    assert capfd.readouterr() == ("", "")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    m = models.mlp(root, batch=2)
    np.save(root / "x.npy", m.feeds["x"])
    return m.path


def test_deploy_json_writes_progress_lines_on_stderr_and_quiet_turns_them_off(mlp, tmp_path) -> None:
    env = {"EDGEINFER_PROGRESS_INTERVAL": "0.001", "EDGEINFER_CACHE_DIR": str(tmp_path / "cache")}
    args = ["deploy", str(mlp), "--board", "host", "--json", "--no-cache"]
    loud = cli(*args, "-o", str(tmp_path / "a"), env=env)
    assert loud.returncode == 0, loud.stderr
    assert json.loads(loud.stdout)["golden"]["passed"]
    assert plain_lines(loud.stderr), loud.stderr
    quiet = cli("--quiet", *args, "-o", str(tmp_path / "b"), env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["golden"]["passed"]
    assert not plain_lines(quiet.stderr) and "done in" not in quiet.stderr, quiet.stderr
