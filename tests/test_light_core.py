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
    importlib.util.find_spec: no ML runtime or toolkit is imported."""
    code = ("from edgeinfer.cli import invoke\nfrom edgeinfer.testing.llm import model_dir\n"
            "for b in ('rk3588-8g', 'atlas-300i-pro', 'core-ultra-155h', 'host'):\n"
            " assert invoke(['plan', str(model_dir()), '--board', b, '--json']) == 0\n"
            "assert invoke(['plan', 'qwen3-0.6b', '--board', 'rk3588-8g', '--runtime', 'rkllm', '--json']) == 0")
    loaded = imported_modules(code)
    heavy = loaded & set(HEAVY + ("rkllm",))
    assert not heavy, f"edgeinfer plan pulled in {sorted(heavy)}"
    assert {"edgeinfer_rknn", "edgeinfer_ascend", "edgeinfer_openvino"} <= loaded  # declarations were read


def test_plan_imports_no_numpy(tmp_path):
    """Plugins import numpy where arrays are handled, and plan registers only the board's backend: planning a
    catalog model, a Hugging Face directory and a .gguf file (read with struct, not the gguf package) on a board
    of every bundled backend loads no numpy."""
    import numpy as np
    from helpers import tiny_gguf

    from edgeinfer.testing.llm import model_dir

    gguf = tiny_gguf(tmp_path / "m.gguf", [("token_embd.weight", np.zeros((10, 64), np.float32))])
    runs = [["plan", "qwen3-8b", "--board", b, "--json"] for b in ("rk3588-16g", "atlas-300i-pro", "core-ultra-258v",
                                                                  "host", "all")]
    runs += [["plan", str(gguf), "--board", "host", "--json"]]
    runs += [["plan", str(model_dir()), "--board", "rk3588-8g"], ["plan", "qwen3-0.6b", "--board", "rk3588-8g",
                                                                  "--paging", "8"]]
    # a runtime another plugin builds on the host (Decoders.builds): every plugin's module is registered
    runs += [["plan", "qwen3-0.6b", "--board", "host", "--runtime", "openvino-cpu", "--quant", "w8a16"]]
    code = f"from edgeinfer.cli import invoke\nfor args in {runs!r}:\n assert invoke(args) in (0, 1), args"
    loaded = imported_modules(code)
    assert "edgeinfer" in loaded and "edgeinfer_rknn" in loaded, sorted(loaded)  # the plans did run
    assert "edgeinfer_openvino" in loaded and "openvino" not in loaded, sorted(loaded)
    assert "numpy" not in loaded, "edgeinfer plan imported numpy"
    assert "gguf" not in loaded, "edgeinfer plan imported the gguf package"
