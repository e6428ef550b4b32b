"""The conformance kits' pytest plugin, registered through the ``pytest11`` entry point of edgeinfer's
distribution (https://docs.pytest.org/en/stable/how-to/writing_plugins.html#making-your-plugin-installable-by-others):
pytest loads it in every run where edgeinfer is installed, so a plugin's own test suite needs no conftest for the
kits' marker. Keep it light: it is imported at every pytest start."""

SLOW = "slow: converts real models (seconds to a minute each); deselect with -m 'not slow'"


def pytest_configure(config) -> None:  # noqa: ANN001 (pytest's Config)
    config.addinivalue_line("markers", SLOW)
