"""A decoder file a backend runs as it is (``Decoders.native``: Rockchip's ``.rkllm``) as a ModelSpec.

Such a file's layout is the vendor's and unpublished (the RKLLM runtime loads it, nothing documents it), so
nothing is read from inside it: its size stands for the weights as stored, the architecture comes from the
``config.json`` of the source model next to it (as ``edgeinfer generate`` finds its tokenizer there), and the
scheme it was quantized in is not recorded anywhere edgeinfer can read.
"""

from __future__ import annotations

from pathlib import Path

from edgeinfer.errors import ModelError
from edgeinfer.planning.models.hf import read_config, spec_from_config
from edgeinfer.planning.models.spec import ModelSpec


def read_decoder_file(path: Path, runtime: str) -> ModelSpec:
    """The spec of ``path``, planned on ``runtime`` only: weights = the file's size, in the scheme the plan
    is asked for (``--quant``) or the runtime's default, which the plan's notes say is assumed."""
    cfg = path.parent / "config.json"
    if not cfg.is_file():
        raise ModelError(f"{path.name}: a {path.suffix} file does not say the model's architecture and there is "
                         "no config.json next to it",
                         f"put the config.json of the model it was converted from into {path.parent}, or plan "
                         f"that model (its directory or Hugging Face id) with --runtime {runtime}")
    spec = spec_from_config(read_config(cfg), path.name, str(path))
    spec.file_format = path.suffix.lstrip(".").lower()
    spec.file_weight_bytes = path.stat().st_size
    spec.runtime = runtime
    spec.notes.append(f"{path.name} runs in {runtime} only; its weights are the file's size "
                      f"({spec.file_weight_bytes / 2**30:.2f} GiB), its architecture is {cfg}'s; the file does "
                      "not record its scheme: planned in --quant's, or the runtime's default")
    return spec
