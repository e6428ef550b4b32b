"""STAND-IN for ``rkllm.api.RKLLM`` of Rockchip's rkllm-toolkit, for tests only: NOT the RKLLM toolkit.

It has the three calls edgeinfer makes (load_huggingface, build, export_rkllm, as in rknn-llm's
examples/*/export/export_rkllm.py), records each call with its arguments, and exports a text file that
the stand-in runtime (plugins/rknn/tests/rkllm_standin.c) loads: "RKLLM-STANDIN vocab=V eos=-1 delay_us=0",
V from the loaded model's config.json. Calls are appended to ``CALLS`` and, when
``$RKLLM_TOOLKIT_STANDIN_LOG`` names a file, written there as JSON lines; ``build`` also records the
content of its ``dataset`` file (edgeinfer deletes it after the conversion).
``$RKLLM_TOOLKIT_STANDIN_FAIL`` = a call's name makes that call return -1, as the toolkit does on failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CALLS: list[tuple[str, dict[str, Any]]] = []


def _record(name: str, kwargs: dict[str, Any]) -> int:
    CALLS.append((name, kwargs))
    log = os.environ.get("RKLLM_TOOLKIT_STANDIN_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"call": name, "kwargs": kwargs}) + "\n")
    return -1 if os.environ.get("RKLLM_TOOLKIT_STANDIN_FAIL") == name else 0


class RKLLM:
    def __init__(self) -> None:
        self._vocab: int | None = None

    def load_huggingface(self, model: str, **kwargs: Any) -> int:
        self._vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
        return _record("load_huggingface", {"model": model, **kwargs})

    def build(self, **kwargs: Any) -> int:
        dataset = kwargs.get("dataset")
        seen = json.loads(Path(dataset).read_text(encoding="utf-8")) if dataset else None
        return _record("build", {**kwargs, "dataset_content": seen})

    def export_rkllm(self, export_path: str) -> int:
        code = _record("export_rkllm", {"export_path": export_path})
        if code == 0:
            Path(export_path).write_text(f"RKLLM-STANDIN vocab={self._vocab} eos=-1 delay_us=0")
        return code
