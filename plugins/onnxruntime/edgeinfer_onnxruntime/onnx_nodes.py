"""The ops an ONNX file's graph uses, read from the protobuf wire format without importing ``onnx`` (~8 MiB of a
serve decoder worker's RSS, bench/README.md "A decoder worker without onnx"), the weights' fields skipped unread.

Wire format: https://protobuf.dev/programming-guides/encoding/. Field numbers, from
https://github.com/onnx/onnx/blob/main/onnx/onnx.proto: ``ModelProto.graph`` 7, ``GraphProto.node`` 1,
``NodeProto.op_type`` 4 and ``NodeProto.domain`` 7. Nodes of subgraphs (an ``If``'s branches) are not read: the
rewrites that add edgeinfer's ops put them in the main graph. Standard library only.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

MODEL_GRAPH, GRAPH_NODE, NODE_OP_TYPE, NODE_DOMAIN = 7, 1, 4, 7
LENGTH_DELIMITED = 2
SKIP = {0: None, 1: 8, 5: 4}  # the other wire types: varint, 64-bit, 32-bit


def ops(path: Path) -> set[tuple[str, str]]:
    """(domain, op_type) of each node of the ONNX file's main graph; ``ValueError`` where it is not one."""
    with open(path, "rb") as f:
        end = f.seek(0, io.SEEK_END)
        f.seek(0)
        try:
            return {node for number, size in _fields(f, end) if number == MODEL_GRAPH
                    for node in _nodes(f, f.tell() + size)}
        except (EOFError, ValueError) as e:
            raise ValueError(f"{path}: not an ONNX model ({e})") from None


def _nodes(f: BinaryIO, end: int) -> Iterator[tuple[str, str]]:
    for number, size in _fields(f, end):
        if number == GRAPH_NODE:
            node = io.BytesIO(f.read(size))
            strings = {n: node.read(s) for n, s in _fields(node, size) if n in (NODE_OP_TYPE, NODE_DOMAIN)}
            yield strings.get(NODE_DOMAIN, b"").decode(), strings.get(NODE_OP_TYPE, b"").decode()


def _fields(f: BinaryIO, end: int) -> Iterator[tuple[int, int]]:
    """(field number, payload size) of each length-delimited field of the message that ends at ``end``, ``f`` at
    the payload when it is yielded: the caller reads it or not, the next field is found either way. Fields of the
    other wire types are skipped."""
    while f.tell() < end:
        key = _varint(f)
        number, wire = key >> 3, key & 7
        if wire == LENGTH_DELIMITED:
            size = _varint(f)
            start = f.tell()
            if start + size > end:
                raise ValueError(f"field {number} runs past its message")
            yield number, size
            f.seek(start + size)
        elif wire in SKIP:
            _ = _varint(f) if SKIP[wire] is None else f.seek(SKIP[wire], io.SEEK_CUR)
        else:
            raise ValueError(f"wire type {wire} of field {number}")


def _varint(f: BinaryIO) -> int:
    value = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise EOFError("the file ends inside a field")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
