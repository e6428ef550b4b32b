"""A decoder bundle's load in two halves: what its manifest says about the artifact, read and checked where the
bundle was opened (:func:`edgeinfer.run.bundle.decoder_load`), as plain values (:class:`DecoderLoad`); and the
load itself (:func:`open_load`), which needs nothing more of the manifest. A serve decoder worker is handed the
first by the HTTP process, which opened and verified the bundle at start-up, and runs only the second, so it
never imports the manifest's schema (pydantic and edgeinfer's models of it: ~9 MiB of each worker's RSS,
bench/README.md "A decoder worker without pydantic").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import registry as plugins
from edgeinfer.contract import seal
from edgeinfer.errors import ModelError

if TYPE_CHECKING:
    from edgeinfer.run.generation.generator import Generator


@dataclass(frozen=True)
class DecoderLoad:
    bundle: Path
    backend: str
    artifact: Path
    tokenizer: Path  # its directory
    scheme: str | None
    context: int  # what to load with: the built context or less
    vocab_size: int  # the manifest's, checked against the loaded artifact
    kv_dtype: str | None
    files: dict[str, Any]  # the manifest's record of the bundle's files: their sizes are checked at each load
    options: dict[str, Any] = field(default_factory=dict)  # from the manifest: a paged bundle's window


def disagree(bundle: Path, key: str, value: Any, what: str, truth: Any) -> ModelError:
    return ModelError(f"bundle {bundle}: manifest {key} is {value}, but {what} is {truth}; the manifest does "
                      "not describe this model: deploy the model again")


def open_load(load: DecoderLoad, codec: Any = None, device: str | None = None, slots: int = 1, *,
              verify: bool = True, **options: Any) -> Generator:
    """The Generator of ``load``'s artifact with ``slots`` sequences, the artifact checked against the manifest's
    facts; ``codec``: the bundle's tokenizer (default: read now), or its
    :class:`~edgeinfer.run.generation.text.TokenFacts`. ``verify``: check the bundle's files against the record
    first, as opening a bundle does (a worker loads what the HTTP process opened earlier, or restarts later);
    False where the caller has just opened it."""
    from edgeinfer.planning.device_memory import check_decoder_fits
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

    if verify:
        seal.verify(load.bundle, load.files)
    codec = codec or TextCodec(load.tokenizer)

    be = plugins.get_backend(load.backend)
    check_decoder_fits(be, load.artifact, device, load.context, slots, load.scheme)
    if be.decoders.kv_at_load and load.kv_dtype:  # the planned cache, unless the caller asks for another
        options.setdefault("kv_dtype", load.kv_dtype)
    # load_decoder reads the artifact's stamp once: another backend's or toolkit's artifact is refused there
    decoder = be.load_decoder(load.artifact, device=device, context=load.context, slots=slots,
                              **{**load.options, **options})
    try:
        check_artifact(load, decoder, codec, kv_built="kv_dtype" in be.decoders.convert_options)
    except BaseException:
        decoder.close()
        raise
    return Generator(decoder, codec, load.bundle.resolve().name)


def check_artifact(load: DecoderLoad, decoder: Any, codec: Any, kv_built: bool = True) -> None:
    """The manifest against the loaded artifact, and the tokenizer against both. ``kv_built``: the backend built
    the plan's KV dtype into the artifact (else the device it runs on picks it: OpenVINO's CPU fallback keeps
    f32 for an int8 or int4 IR where the planned NPU keeps fp16)."""
    if decoder.vocab_size != load.vocab_size:
        raise disagree(load.bundle, "decoder.vocab_size", load.vocab_size, "the artifact's vocabulary",
                       decoder.vocab_size)
    if kv_built and load.kv_dtype and decoder.kv_dtype and decoder.kv_dtype != load.kv_dtype:
        raise disagree(load.bundle, "decoder.kv_dtype", load.kv_dtype, "the KV cache the artifact allocates",
                       decoder.kv_dtype)
    if codec.vocab_size > decoder.vocab_size:
        raise ModelError(f"bundle {load.bundle}: its tokenizer has {codec.vocab_size} tokens, more than the model's "
                         f"vocabulary of {decoder.vocab_size}: it would encode text into ids the model has no "
                         "embedding for; deploy the model again with its own tokenizer")
