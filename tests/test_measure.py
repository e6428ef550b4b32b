"""edgeinfer.contract.measure: the one definition of current RSS, peak RSS and latency percentiles."""

from __future__ import annotations

import ast
import mmap
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeinfer.contract import measure

MIB = 2**20


def _touch(n_bytes: int) -> mmap.mmap:
    # an anonymous mapping of its own, not the allocator's: freeing it unmaps it whatever malloc's thresholds
    # are by then in a long test session (a freed 96 MiB bytearray once stayed resident)
    buf = mmap.mmap(-1, n_bytes)
    for off in range(0, n_bytes, 4096):  # every page written, so every page is resident
        buf[off] = 1
    return buf


def test_contract_reexports_the_same_functions_for_plugins():
    from edgeinfer.contract import backend

    assert backend.latency_stats is measure.latency_stats
    assert backend.peak_rss_bytes is measure.peak_rss_bytes


def test_latency_stats_p90_and_mean_of_known_samples():
    stats = measure.latency_stats([5.0, 1.0, 4.0, 2.0, 3.0])
    assert stats == {"mean": 3.0, "p50": 3.0, "p90": 5.0, "p99": 5.0, "min": 1.0, "max": 5.0}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux")
def test_current_rss_grows_with_touched_memory_and_peak_covers_it():
    before = measure.current_rss_bytes()
    buf = _touch(96 * MIB)
    during = measure.current_rss_bytes()
    assert during - before >= 80 * MIB
    del buf
    assert measure.current_rss_bytes() < during - 64 * MIB  # freed: current RSS drops ...
    assert measure.peak_rss_bytes() >= during - MIB  # ... the peak does not (kernel counters lag by a few pages)


@pytest.mark.skipif(not measure.reset_peak_rss(), reason="no /proc/self/clear_refs here")
def test_reset_starts_a_new_peak():
    buf = _touch(96 * MIB)
    del buf
    high = measure.peak_rss_bytes()
    assert high - measure.current_rss_bytes() >= 64 * MIB  # the freed buffer still counts before a reset
    assert measure.reset_peak_rss()
    assert measure.peak_rss_bytes() < high - 64 * MIB
    buf = _touch(32 * MIB)
    assert measure.peak_rss_bytes() >= measure.current_rss_bytes() - MIB
    del buf


def test_a_fresh_subprocess_does_not_report_its_parents_peak():
    parent = _touch(128 * MIB)
    code = "from edgeinfer.contract.measure import peak_rss_bytes; print(peak_rss_bytes())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    del parent
    assert int(out) < measure.peak_rss_bytes() - 64 * MIB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux")
def test_current_rss_of_another_process_and_of_one_that_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        assert measure.current_rss_bytes(child.pid) > MIB
    finally:
        child.kill()
        child.wait()
    assert measure.current_rss_bytes(child.pid) is None


def test_measure_imports_only_the_standard_library():
    tree = ast.parse(Path(measure.__file__).read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots and roots <= set(sys.stdlib_module_names) | {"__future__"}, roots


def test_others_busy_is_the_machines_busy_time_less_this_processs_over_the_wall_time():
    """Samples are (wall s, machine busy CPU s, this process's CPU s): 3 s of machine time in 2 s of wall time, 1 of
    them this process's, leaves 1 CPU kept busy by other work."""
    assert measure.others_busy_cpus((10.0, 100.0, 5.0), (12.0, 103.0, 6.0)) == 1.0
    assert measure.others_busy_cpus((10.0, 100.0, 5.0), (12.0, 101.0, 6.01)) == 0.0  # ticks rounding: never below 0
    assert measure.others_busy_cpus((10.0, 100.0, 5.0), (10.1, 101.0, 5.0)) is None  # under MIN_LOAD_WINDOW_S
    assert measure.others_busy_cpus(None, (12.0, 103.0, 6.0)) is None


@pytest.mark.skipif(measure.cpu_sample() is None, reason="no /proc/stat")
def test_a_process_spinning_beside_this_one_is_counted_as_other_work():
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)  # started and spinning
        before = measure.cpu_sample()
        time.sleep(1.0)
        others = measure.others_busy_cpus(before, measure.cpu_sample())
    finally:
        spin.kill()
        spin.wait()
    assert others is not None and others >= 0.4  # a whole CPU where the child gets one; other tests only add


def test_the_busy_note_speaks_from_half_a_cpu_and_a_quarter_of_the_machine():
    assert measure.busy_note(0.4, cpus=2) is None and measure.busy_note(None, cpus=2) is None
    note = measure.busy_note(0.5, cpus=2)
    assert note.startswith("other work kept 0.5 of this machine's 2 CPUs busy while it was timed")
    assert measure.busy_note(3.0, cpus=16) is None
    assert "4 of this machine's 16 CPUs" in measure.busy_note(4.0, cpus=16)
