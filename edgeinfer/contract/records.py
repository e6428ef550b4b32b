"""The small typed records of the backend contract: what a backend declares (:class:`Tensors`,
:class:`Decoders`, :class:`Needs`) and what its optional facts answer (:class:`PagingLimit`, :class:`Placement`).

A backend declares its data as two class attributes, one per capability, each defaulting to "nothing
special"; a tensor-only backend writes one line (``tensors = Tensors(native=(".onnx",))``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Needs:
    """A library a conversion needs besides the backend's own (e.g. a vendor toolkit for one runtime):
    found with ``importlib.util.find_spec`` on its top-level module, never imported, so ``edgeinfer plan``
    stays light."""

    module: str  #: top-level module name ("rkllm")
    what: str  #: the library in the user's words ("the RKLLM toolkit (package rkllm-toolkit, rkllm.api)")
    get: str  #: how to install it

    def missing(self) -> str | None:
        """What is missing and how to get it, or None when the module is importable here."""
        if importlib.util.find_spec(self.module) is not None:
            return None
        return f"{self.what} is not installed: {self.get}"


@dataclass(frozen=True)
class Tensors:
    """The *tensors* capability (``convert`` + ``open``): the files and schemes it takes, as data."""

    #: file suffixes ``load`` takes as they are (".onnx", ".xml", ".rknn", ...); the first is what ``quantize`` writes
    native: tuple[str, ...] = ()
    #: model formats ``convert`` takes: "onnx", "hf" (a Hugging Face directory), "pt2"
    sources: tuple[str, ...] = ("onnx",)
    #: schemes ``convert`` accepts, canonical names from :mod:`edgeinfer.contract.schemes`
    schemes: tuple[str, ...] = ("fp32",)
    #: the scheme used when a non-native model is loaded directly (lossless or fp16)
    default_scheme: str = "fp32"
    #: the ``**options`` ``convert`` / ``open`` take; the core refuses any other before calling them
    convert_options: tuple[str, ...] = ()
    open_options: tuple[str, ...] = ()
    #: what the runtime cannot do, with why: {"dynamic_shapes": "why"}; the conformance kit skips those cases
    gaps: Mapping[str, str] = field(default_factory=dict)
    #: extras of the plugin's own distribution that running an artifact needs besides its dependencies: a
    #: bundle's manifest records them (``requires``) and ``verify`` says whether this installation has them
    extras: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decoders:
    """The *decoders* capability (``open_decoder``, and ``convert_decoder`` to deploy), as data."""

    #: schemes ``convert_decoder`` produces, the preferred (deploy's default) first
    schemes: tuple[str, ...] = ()
    #: the Hugging Face ``model_type`` values ``convert_decoder`` exports for the board's backend runtime
    #: ("llama", "qwen2", ...): ``plan`` and ``deploy`` refuse another there before converting anything;
    #: None: not declared, the conversion decides
    architectures: tuple[str, ...] | None = None
    #: the ``**options`` ``open_decoder`` takes; the core refuses any other
    options: tuple[str, ...] = ()
    #: the ``**options`` ``convert_decoder`` takes; deploy passes every backend ``target`` (the board's)
    convert_options: tuple[str, ...] = ("target",)
    #: board runtimes besides the board's backend runtime (``Board.backend_runtime``) that ``convert_decoder``
    #: builds for when deploy passes the convert option ``runtime``, each with what it needs besides the
    #: backend (None: nothing more): ``{"rkllm": Needs("rkllm", ...)}``
    runtimes: Mapping[str, Needs | None] = field(default_factory=dict)
    #: board runtimes this backend builds as its own on every board, whichever backend the board names (a
    #: runtime of its own, such as llama.cpp), each with what it needs besides the backend: plan and deploy hand
    #: such a runtime to this backend, which gets the ``runtime`` option for it only where ``runtimes`` lists it too
    builds: Mapping[str, Needs | None] = field(default_factory=dict)
    #: load options that make ``open_decoder`` give a step decoder (logits) where its default is a native
    #: loop: the decoder golden check compares logits
    logits_options: Mapping[str, Any] = field(default_factory=dict)
    #: decoder files ``open_decoder`` takes as they are (a vendor toolkit's own format): suffix → the board
    #: runtime (``runtimes`` in the board profiles) that runs them, e.g. {".rkllm": "rkllm"}; the core
    #: tokenizes with the tokenizer.json next to such a file and plans it on that runtime only
    native: Mapping[str, str] = field(default_factory=dict)
    #: extras of the plugin's own distribution that running a decoder bundle needs besides its dependencies
    #: (``("decoders",)`` for a runtime kept out of a board's encoder install); recorded in the bundle's manifest
    extras: tuple[str, ...] = ()
    #: what ``convert_decoder`` builds by default that neither the scheme's name nor an option states (a block
    #: size, ...): part of deploy's conversion cache key, so a conversion cached under another default is not
    #: reused (e.g. ``{"int8_block_size": 128}``)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: convert options that keep an integer scheme's conversion closer to the reference, each with what deploy's
    #: refusal says to try when the decoder golden check fails and the option was not given
    #: (e.g. ``{"group_size": "smaller blocks: --option group_size=N (N below the default)"}``)
    closer: Mapping[str, str] = field(default_factory=dict)

    @property
    def pages(self) -> bool:
        """Whether the backend builds and loads layer-paged decoders: convert option ``segments`` and load option
        ``window`` (``deploy --paging``; docs/paging.md)."""
        return "segments" in self.convert_options and "window" in self.options

    @property
    def kv_at_load(self) -> bool:
        """Whether the backend allocates the KV dtype it is given at load (load option ``kv_dtype``) rather than
        one built into the artifact (convert option ``kv_dtype``): deploy records the plan's in the manifest
        (``decoder.kv_dtype``) and every load passes it."""
        return "kv_dtype" in self.options and "kv_dtype" not in self.convert_options

    def refusal(self, architecture: str, backend: str) -> str | None:
        """Why ``backend`` cannot export a decoder of ``architecture`` (a ``model_type``), or None."""
        if self.architectures is None or architecture in self.architectures:
            return None
        return (f"backend {backend!r} exports {', '.join(self.architectures)} decoders, not {architecture!r}; "
                "pick a model of those architectures or a board whose backend exports it")


@dataclass(frozen=True)
class PagingLimit:
    """The limits of layer-paged execution on a device (``Backend.paging_limit``)."""

    max_window: int | None  # most segments resident at once; None: any
    background: bool  # whether segments may be loaded on a background thread (prefetch)
    why: str  # the reason, quoted in the session's notes when a limit applies


@dataclass(frozen=True)
class Placement:
    """What one ``serve --devices`` entry means for a worker process (``Backend.placement``)."""

    env: Mapping[str, str] = field(default_factory=dict)  # set before the backend is imported
    device: str | None = None  # passed to ``load``; None: the default device
    options: Mapping[str, Any] = field(default_factory=dict)  # load options
