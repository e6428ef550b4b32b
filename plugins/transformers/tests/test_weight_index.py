"""A Hugging Face directory's weight index names shard files; transformers joins each name to the directory as
it is, so an index naming ``../elsewhere/model.safetensors`` would load weights from outside the model."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest

from edgeinfer.testing.cli import run_cli
from edgeinfer.testing.llm import model_dir


def _dir_with_index(tmp_path: Path, shard: str) -> Path:
    """The committed tiny decoder without its weights file, and an index naming ``shard`` for every tensor;
    ``tmp_path/outside/model.safetensors`` holds the real weights."""
    from safetensors import safe_open

    model, outside = tmp_path / "model", tmp_path / "outside"
    model.mkdir()
    outside.mkdir()
    for f in model_dir().iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, model / f.name)
    shutil.copy(model_dir() / "model.safetensors", outside / "model.safetensors")
    with safe_open(str(model_dir() / "model.safetensors"), "np") as st:
        names = list(st.keys())
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {},
                                                                     "weight_map": {n: shard for n in names}}))
    return model


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): no interpreter start-up per call."""
    return functools.partial(run_cli, capfd)


@pytest.mark.parametrize("shard", ["../outside/model.safetensors", "ABSOLUTE"])
def test_a_weight_index_naming_a_shard_outside_the_directory_is_refused(tmp_path, shard, cli):
    shard = str(tmp_path / "outside" / "model.safetensors") if shard == "ABSOLUTE" else shard
    model = _dir_with_index(tmp_path, shard)
    proc = cli("generate", str(model), "--prompt", "hi", "--max-new-tokens", "2")
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "weight_map entry" in errors[0] and "Traceback" not in proc.stderr, proc.stderr
    assert ("'..'" if shard.startswith("..") else "absolute path") in errors[0]


def test_a_weight_index_inside_the_directory_loads(tmp_path):
    """The same layout with the shard inside the directory is an ordinary sharded model: it loads."""
    model = _dir_with_index(tmp_path, "model-00001-of-00001.safetensors")
    shutil.move(tmp_path / "outside" / "model.safetensors", model / "model-00001-of-00001.safetensors")
    import edgeinfer

    with edgeinfer.load(model, ctx=32) as gen:
        assert gen.generate("hi", max_new_tokens=2).token_ids
