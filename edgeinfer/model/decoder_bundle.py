"""Decoder bundles: what ``edgeinfer deploy`` writes for a causal language model (opened by
:func:`edgeinfer.run.bundle.open_generator`).

Layout (next to ``manifest.json``, sealed like every bundle)::

    decoder/                 the backend's decoder artifact (what ``convert_decoder`` wrote)
    decoder.stamp.json       its stamp
    tokenizer/               tokenizer.json, tokenizer_config.json, chat template, generation_config.json,
                             config.json: what the core's TextCodec reads
    golden/reference.npz     the fp32 reference's greedy tokens and logits per golden prompt

The manifest's ``decoder`` section says what the bundle is (``kind``), the context it was built
for, the vocabulary, the board runtime, where the tokenizer lives and the golden report of the deploy
(``ran: false`` with the reason, and no ``golden/``, when the artifact cannot run on the deploying host);
a layer-paged bundle's ``paging`` its segments, the window it runs with and the plan's figures for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from edgeinfer.contract import seal
from edgeinfer.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from edgeinfer.model.bundle import Bundle

ARTIFACT = "decoder"
TOKENIZER = "tokenizer"
REFERENCE = "golden/reference.npz"
PROMPTS = "golden/prompts.json"
MAX_CONTEXT = 1 << 24
# the Hugging Face files the bundle keeps beside the artifact (those the model has)
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
            "generation_config.json", "config.json")


class DecoderPaging(BaseModel):
    """The decoder section's ``paging``: a layer-paged bundle (``deploy --paging``), run with ``window`` of
    its ``segments`` resident unless the loader is given another window."""

    model_config = ConfigDict(extra="forbid", strict=True)
    segments: int = Field(ge=1)
    window: int = Field(ge=1)
    chosen_by: StrictStr | None = None  # --paging W --segments N, or what --paging auto chose
    max_window: int | None = Field(None, ge=1)  # the largest window the plan fits on the board (--window's limit)
    predicted: dict[str, Any] | None = None  # the plan's paging figures at this window (docs/paging.md)


class DecoderSection(BaseModel):
    """The manifest's ``decoder`` section."""

    model_config = ConfigDict(extra="forbid", strict=True)
    kind: Literal["causal_lm"] = "causal_lm"
    architecture: StrictStr = ""
    context: int = Field(ge=1, le=MAX_CONTEXT)  # positions the bundle was built and checked for
    vocab_size: int = Field(ge=1)
    runtime: StrictStr | None = None  # the board runtime it was built for (a board profile's runtimes)
    kv_dtype: StrictStr | None = None  # the plan's KV-cache dtype (fp32, fp16, q8_0 ...), what open_decoder allocates
    tokenizer: StrictStr = TOKENIZER
    golden: dict[str, Any] | None = None  # the deploy's golden report (run/generation/golden.py)
    golden_reference: StrictStr | None = REFERENCE
    paging: DecoderPaging | None = None  # layer-paged bundles only


def check_paths(root: Path, section: dict[str, Any], sealed: set[str]) -> None:
    """The section's paths stay inside the bundle and name sealed files."""
    named = [("decoder.tokenizer", f"{section.get('tokenizer', TOKENIZER)}/tokenizer.json")]
    if section.get("golden_reference"):
        named.append(("decoder.golden_reference", section["golden_reference"]))
    for field_name, rel in named:
        seal.contained(root, rel, field_name)
        if seal.relative(rel, field_name) not in sealed:
            raise InputError(f"manifest {field_name} {rel!r} is not among the bundle's recorded files; "
                             "deploy the model again", kind="bundle_damaged")


def tokenizer_dir(bundle: Bundle) -> Path:
    """The directory of a decoder bundle's tokenizer (and its model's config.json)."""
    return seal.contained(bundle.path, bundle.manifest.decoder.get("tokenizer", TOKENIZER), "decoder.tokenizer")


def loaded_context(bundle: Bundle, ctx: int | None) -> int:
    """The context to load a decoder bundle with: ``ctx``, at most the one it was built for (the default)."""
    built = int(bundle.manifest.decoder["context"])
    if ctx is None:
        return built
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1:
        raise InputError(f"ctx must be a positive integer, got {ctx!r}")
    if ctx > built:
        raise InputError(f"bundle {bundle.path} was built for a context of {built} tokens, not {ctx}; use --ctx "
                         f"{built} or less, or deploy again with --ctx {ctx}")
    return ctx


def check_slots(bundle: Bundle, slots: int) -> None:
    """Refuse more sequences at once than the bundle's artifact decodes: a backend whose decode graphs have
    static batch sizes stamps the largest as ``max_slots`` (rknn: the deploy's ``decode_batches``)."""
    from edgeinfer.contract import stamp

    most = (stamp.read(bundle.artifacts[0]) or {}).get("max_slots")
    if isinstance(most, int) and slots > most:
        wider = ",".join(map(str, sorted({1, most, slots})))
        raise InputError(f"--slots {slots}: bundle {bundle.path.name} decodes at most {most} sequences at once "
                         f"(its decode graphs were built for up to {most}); use --slots {most} or less, or deploy "
                         f"again with --option decode_batches={wider}")


# --- the golden reference kept in the bundle ---------------------------------------------------------


@dataclass
class Recorded:
    """One prompt's greedy run: the generated ids and the logits at every step."""

    prompt: str
    token_ids: list[int]
    logits: list[np.ndarray]


def save_reference(directory: Path, recorded: list[Recorded]) -> None:
    """``golden/prompts.json`` (the prompts) and ``golden/reference.npz`` (ids and logits, no pickle)."""
    import numpy as np

    (directory / "golden").mkdir(exist_ok=True)
    (directory / PROMPTS).write_text(json.dumps([r.prompt for r in recorded], ensure_ascii=False, indent=1) + "\n")
    arrays = {}
    for i, r in enumerate(recorded):
        arrays[f"{i}/ids"] = np.asarray(r.token_ids, dtype=np.int64)
        arrays[f"{i}/logits"] = np.stack(r.logits).astype(np.float32) if r.logits else np.zeros((0, 0), np.float32)
    np.savez_compressed(directory / REFERENCE, **arrays)


def load_reference(bundle: Bundle) -> list[Recorded]:
    """The recorded reference of a decoder bundle (refused, never unpickled, when malformed)."""
    from edgeinfer.model.samples import load_saved_samples

    prompts_path = bundle.file(PROMPTS, "golden prompts")
    try:
        prompts = json.loads(prompts_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{prompts_path} is not valid JSON ({e}); deploy the model again",
                         kind="bundle_damaged") from None
    rows = load_saved_samples(bundle.file(bundle.manifest.decoder.get("golden_reference") or REFERENCE,
                                          "golden reference"))
    if not (isinstance(prompts, list) and all(isinstance(p, str) for p in prompts) and len(prompts) == len(rows)
            and all(set(r) == {"ids", "logits"} for r in rows)):
        raise InputError(f"the golden reference of bundle {bundle.path} is malformed; deploy the model again",
                         kind="bundle_damaged")
    return [Recorded(p, [int(t) for t in r["ids"]], list(r["logits"])) for p, r in zip(prompts, rows)]
