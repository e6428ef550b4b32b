"""Whether a board's backend can export a decoder's architecture: ``plan`` refuses one it cannot, and so
``deploy`` (which plans first) before anything is converted. The list is the backend's, as data
(``Backend.decoders.architectures``); the message is ``Decoders.refusal``."""

from __future__ import annotations

from edgeinfer.errors import InputError
from edgeinfer.planning.boards import Board
from edgeinfer.planning.models.spec import ModelSpec


def refuse_unexportable(spec: ModelSpec, board: Board, runtime: str) -> None:
    """Raise an InputError when ``spec`` is a Hugging Face decoder planned on the runtime that ``board``'s backend
    deploys for, and the backend declares the architectures it exports without this one. A backend that is not
    installed is not asked: plan works without plugins."""
    why = unexportable(spec, board, runtime)
    if why:
        raise InputError(why, kind="not_supported")


def unexportable(spec: ModelSpec, board: Board, runtime: str) -> str | None:
    """Why ``board``'s backend cannot export the decoder ``spec`` for ``runtime``, or None."""
    if spec.encoder or not spec.has_kv or spec.file_format in ("gguf", "onnx"):
        return None
    if runtime != (board.backend_runtime or board.default_runtime):
        return None  # another runtime (llama.cpp, RKLLM's own toolkit ...) is not the backend's export
    from edgeinfer.contract import registry  # only here: a decoder planned on its backend's runtime

    entry = registry.registry().backend(board.backend)
    model_type = spec.architecture.removesuffix(" (approximate)")  # an architecture planned from its tensors
    why = entry.cls.decoders.refusal(model_type, entry.cls.name) if entry else None
    return f"board {board.name}: {why}" if why else None
