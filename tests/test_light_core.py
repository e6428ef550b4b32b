"""`import edgeinfer` and CLI start-up import no ML runtime or vendor SDK (plugins included)."""

from helpers import HEAVY, imported_modules


def test_import_edgeinfer_is_light():
    heavy = imported_modules("import edgeinfer") & set(HEAVY)
    assert not heavy, f"import edgeinfer pulled in {sorted(heavy)}"


def test_cli_startup_with_every_plugin_is_light():
    code = ("import sys; sys.argv=['edgeinfer','--help']\nfrom edgeinfer.cli import main\n"
            "try:\n main()\nexcept SystemExit:\n pass")
    heavy = imported_modules(code) & set(HEAVY)
    assert not heavy, f"edgeinfer --help pulled in {sorted(heavy)} (a plugin imports its SDK at module level?)"


def test_plan_asks_what_this_installation_builds_without_importing_a_runtime():
    """plan reads the board's backend declarations (planning/decision.py) and looks the RKLLM toolkit up with
    importlib.util.find_spec: no ML runtime or toolkit is imported (numpy is: plugin backend modules import it)."""
    code = ("from edgeinfer.cli import invoke\nfrom edgeinfer.testing.llm import model_dir\n"
            "for b in ('rk3588-8g', 'atlas-300i-pro', 'core-ultra-155h', 'host'):\n"
            " assert invoke(['plan', str(model_dir()), '--board', b, '--json']) == 0\n"
            "assert invoke(['plan', 'qwen3-0.6b', '--board', 'rk3588-8g', '--runtime', 'rkllm', '--json']) == 0")
    loaded = imported_modules(code)
    heavy = loaded & set(HEAVY + ("rkllm",))
    assert not heavy, f"edgeinfer plan pulled in {sorted(heavy)}"
    assert {"edgeinfer_rknn", "edgeinfer_ascend", "edgeinfer_openvino"} <= loaded  # declarations were read
