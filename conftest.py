import os

pytest_plugins = ["edgeinfer.testing.fixtures"]

# the host board's memory bandwidth is given to every test (and the commands they start), not measured into
# each test's cache directory: tests/test_host_board.py measures it, with this variable removed
os.environ.setdefault("EDGEINFER_HOST_BANDWIDTH_GBPS", "20")

# progress lines (one every 10 s off a terminal, as under pytest) would add lines to the stderr that tests count
# whenever a step runs long on a loaded machine; tests/test_progress.py sets the interval it tests
os.environ.setdefault("EDGEINFER_PROGRESS_INTERVAL", "3600")
