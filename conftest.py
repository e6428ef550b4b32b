pytest_plugins = ["edgeinfer.testing.fixtures"]
