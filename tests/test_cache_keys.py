"""What a conversion cache key is made of (edgeinfer/contract/cache.py): the code that converts is part of it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from edgeinfer.contract import cache


def test_source_digest_changes_with_any_source_file(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    before = cache.source_digest([pkg])
    assert cache.source_digest([pkg]) == before
    (pkg / "sub" / "b.py").write_text("y = 3\n")
    assert cache.source_digest([pkg]) != before
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    assert cache.source_digest([pkg]) == before
    (pkg / "c.py").write_text("")
    assert cache.source_digest([pkg]) != before


def _plugin(root: Path, body: str) -> object:
    """An instance of ``Backend`` from a package ``code_key_plugin`` under ``root`` whose converter is ``body``."""
    pkg = root / "code_key_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .backend import Backend\n")
    (pkg / "backend.py").write_text(f"class Backend:\n    def convert(self):\n        return {body!r}\n")
    for name in [m for m in sys.modules if m.startswith("code_key_plugin")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("code_key_plugin").Backend()
    finally:
        sys.path.remove(str(root))


def test_a_plugin_whose_code_changed_gets_another_key(tmp_path: Path) -> None:
    """A source tree or editable install changes its conversion code without a version bump: the deploy caches
    (decoder and encoder) key on the plugin package's sources, so the old conversion is not reused."""
    first = cache.code(_plugin(tmp_path / "a", "digits"))
    assert cache.code(sys.modules["code_key_plugin.backend"]) == first  # a plugin module names its package too
    assert first == cache.code(_plugin(tmp_path / "b", "digits"))  # the same sources, wherever they are
    assert cache.code(_plugin(tmp_path / "c", "planes")) != first
    assert len(first) == 16



def test_a_plugin_of_one_module_is_keyed_by_that_file(tmp_path: Path) -> None:
    """Not by every source file in the folder it was installed into (site-packages)."""
    (tmp_path / "one_module_plugin.py").write_text("class Backend:\n    pass\n")
    (tmp_path / "neighbour.py").write_text("x = 1\n")
    sys.modules.pop("one_module_plugin", None)
    importlib.invalidate_caches()
    sys.path.insert(0, str(tmp_path))
    try:
        before = cache.code(importlib.import_module("one_module_plugin").Backend())
    finally:
        sys.path.remove(str(tmp_path))
    cache._digest.cache_clear()
    (tmp_path / "neighbour.py").write_text("x = 2\n")
    assert cache.code(sys.modules["one_module_plugin"]) == before
    (tmp_path / "one_module_plugin.py").write_text("class Backend:\n    pass  # changed\n")
    cache._digest.cache_clear()
    assert cache.code(sys.modules["one_module_plugin"]) != before


def test_a_plugin_imported_from_a_zip_archive_has_no_digest_and_no_error(tmp_path: Path) -> None:
    import zipfile

    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_plugin.py", "class Backend:\n    pass\n")
    sys.modules.pop("zipped_plugin", None)
    sys.path.insert(0, str(archive))
    try:
        backend = importlib.import_module("zipped_plugin").Backend()
    finally:
        sys.path.remove(str(archive))
    assert cache.code(backend) == ""
