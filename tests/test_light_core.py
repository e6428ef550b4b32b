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
