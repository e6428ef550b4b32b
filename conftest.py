import os

# Before anything imports torch: one OpenMP thread in every test process and what it starts. `make test` runs two
# pytest-xdist workers on a 2-core machine, and tests start servers, workers and conversions of their own; torch's
# OpenMP pools (two threads each) spinning beside each other slowed torch-heavy tests 1.5-3.5x (docs/architecture.md
# #tests). A value set by whoever runs the tests wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

pytest_plugins = ["edgeinfer.testing.fixtures"]

# the host board's memory bandwidth is given to every test (and the commands they start), not measured into
# each test's cache directory: tests/test_host_board.py measures it, with this variable removed
os.environ.setdefault("EDGEINFER_HOST_BANDWIDTH_GBPS", "20")

# progress lines (one every 10 s off a terminal, as under pytest) would add lines to the stderr that tests count
# whenever a step runs long on a loaded machine; tests/test_progress.py sets the interval it tests
os.environ.setdefault("EDGEINFER_PROGRESS_INTERVAL", "3600")

SHARED_SCOPES = ("module", "class")
SERIAL_GROUPS = ("timing", "ray")  # latency and memory peaks; Ray clusters (their failure timings)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups and before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Scheduling under ``make test`` (docs/architecture.md#tests): a test in an xdist group of SERIAL_GROUPS
    runs in the serial pass; a test without a group that uses a module- or class-scoped fixture is grouped with
    its module, so that ``--dist loadgroup`` builds that fixture (a deploy, a server) on one worker, not on both.
    Modules with slow tests come first (in their own order): xdist hands out work in collection order (groups by
    size first), and a minute-long test handed out last would leave the other worker idle meanwhile."""
    slow = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow)  # stable: each module keeps its order
    for item in items:
        groups = [m.args[0] if m.args else m.kwargs.get("name") for m in item.iter_markers("xdist_group")]
        if set(groups) & set(SERIAL_GROUPS):
            item.add_marker(pytest.mark.serial)
        elif not groups and _uses_shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def _uses_shared_fixture(item: pytest.Item) -> bool:
    """A module- or class-scoped fixture, or a session-scoped one the test's own module defines (no other module
    sees it: on two workers it is built twice, like a module's)."""
    info = getattr(item, "_fixtureinfo", None)  # pytest's Function: the fixture definitions it was collected with
    defs = [d[-1] for d in info.name2fixturedefs.values() if d] if info is not None else []
    module = item.nodeid.split("::", 1)[0]
    return any(d.scope in SHARED_SCOPES or (d.scope == "session" and d.baseid == module) for d in defs)
