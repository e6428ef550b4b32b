import os

pytest_plugins = ["edgeinfer.testing.fixtures"]

# the host board's memory bandwidth is given to every test (and the commands they start), not measured into
# each test's cache directory: tests/test_host_board.py measures it, with this variable removed
os.environ.setdefault("EDGEINFER_HOST_BANDWIDTH_GBPS", "20")
