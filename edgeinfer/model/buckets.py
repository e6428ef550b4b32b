"""The manifest's ``buckets`` section: a bundle for a backend that compiles static shapes (an NPU) holds one
artifact per (batch × sequence) shape (written by :mod:`edgeinfer.deploy.buckets`, run by
:mod:`edgeinfer.run.buckets`)::

    "buckets": {"chosen_by": "...", "items": [{"batch": 1, "seq": 128, "artifact": "model.xml"},
                                              {"batch": 4, "seq": 32, "artifact": "buckets/4x32/model.xml"}, ...]}

Sequence buckets are only made for models with an ``attention_mask`` input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from edgeinfer.contract import seal
from edgeinfer.contract.backend import TensorSpec
from edgeinfer.errors import InputError

MASK = "attention_mask"


class BucketItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    batch: int = Field(ge=1, le=65_536)
    seq: int = Field(ge=1, le=131_072)
    artifact: StrictStr = Field(min_length=1)
    golden: Annotated[dict[str, Any], Field()] | None = None


class BucketsSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    chosen_by: StrictStr = ""
    items: list[BucketItem] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _unique(self) -> BucketsSection:
        shapes = [(i.batch, i.seq) for i in self.items]
        arts = [i.artifact for i in self.items]
        if len(set(shapes)) != len(shapes) or len(set(arts)) != len(arts):
            raise ValueError("each bucket needs its own (batch, seq) and its own artifact")
        return self


def check_paths(path: Path, section: dict[str, Any], sealed: set[str]) -> None:
    """Every bucket artifact stays inside the bundle and is among its sealed files."""
    for i, item in enumerate(section["items"]):
        what = f"buckets.items[{i}].artifact"
        seal.contained(path, item["artifact"], what)
        if seal.relative(item["artifact"], what) not in sealed:
            raise InputError(f"manifest {what} {item['artifact']!r} is not among the bundle's recorded files; "
                             "deploy the model again", kind="bundle_damaged")


def longest_seq(section: dict[str, Any] | None, inputs: list[TensorSpec]) -> int | None:
    """A bucketed bundle with sequence buckets (and an attention mask) takes any length up to this; else None."""
    seqs = {i["seq"] for i in section["items"]} if section else set()
    return max(seqs) if len(seqs) > 1 and MASK in {s.name for s in inputs} else None
