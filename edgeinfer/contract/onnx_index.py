"""What an ONNX file's graph holds, read without reading its weights: which graph inputs index an embedding table
(:func:`embedding_index_limits`), which ops its nodes are (:func:`graph_ops`).

``onnx.load`` parses the whole protobuf, embedded weights included (``load_external_data=False`` only spares
weights kept in other files): for a MiniLM bundle that put ~170 MiB on the peak of ``serve``'s HTTP process,
which only needs the tables' row counts. This walks the protobuf wire format (https://protobuf.dev/programming-guides/encoding/)
of the ONNX messages (field numbers from onnx/onnx.proto) and seeks past every field it does not need, so a
tensor's data is never read.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

# onnx.proto field numbers
MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT = 1, 5, 11
NODE_INPUT, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 4, 5, 7
ATTR_NAME, ATTR_I = 1, 3
TENSOR_DIMS, TENSOR_NAME = 1, 8
VALUE_INFO_NAME = 1
VARINT, I64, LEN, I32 = 0, 1, 2, 5


def _varint(read) -> int:
    out = shift = 0
    while True:
        b = read(1)
        if not b:
            raise ValueError("truncated varint")
        out |= (b[0] & 0x7F) << shift
        if b[0] < 0x80:
            return out
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(f: BinaryIO, end: int):
    """(field, wire type, value) up to offset ``end``; a LEN value is (start, length) and is not read."""
    while f.tell() < end:
        key = _varint(f.read)
        field, wire = key >> 3, key & 7
        if wire == VARINT:
            yield field, wire, _varint(f.read)
        elif wire == LEN:
            n = _varint(f.read)
            start = f.tell()
            yield field, wire, (start, n)
            f.seek(start + n)
        elif wire in (I64, I32):
            f.seek(8 if wire == I64 else 4, 1)
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _message(f: BinaryIO, span: tuple[int, int]) -> dict[int, list]:
    """A small message's fields: each field → its values (LEN values as bytes)."""
    return _parse(_read(f, span))


def _parse(data: bytes) -> dict[int, list]:
    out: dict[int, list] = {}
    pos = 0
    while pos < len(data):
        key, pos = _buf_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == VARINT:
            val, pos = _buf_varint(data, pos)
        elif wire == LEN:
            ln, pos = _buf_varint(data, pos)
            val, pos = data[pos:pos + ln], pos + ln
        elif wire in (I64, I32):
            pos += 8 if wire == I64 else 4
            continue
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.setdefault(field, []).append(val)
    return out


def _buf_varint(data: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7


def _signed(v: int) -> int:
    return struct.unpack("<q", struct.pack("<Q", v))[0]


def _tensor_dims_name(f: BinaryIO, span: tuple[int, int]) -> tuple[list[int], str]:
    """An initializer's dims and name; its data fields are skipped, never read."""
    dims: list[int] = []
    name = ""
    here = f.tell()
    f.seek(span[0])
    for field, wire, val in _fields(f, span[0] + span[1]):
        if field == TENSOR_DIMS and wire == VARINT:
            dims.append(_signed(val))
        elif field == TENSOR_DIMS and wire == LEN:  # packed
            data, pos = _read(f, val), 0
            while pos < len(data):
                d, pos = _buf_varint(data, pos)
                dims.append(_signed(d))
        elif field == TENSOR_NAME and wire == LEN:
            name = _read(f, val).decode("utf-8", "replace")
    f.seek(here)
    return dims, name


def _read(f: BinaryIO, span: tuple[int, int]) -> bytes:
    here = f.tell()
    f.seek(span[0])
    data = f.read(span[1])
    f.seek(here)
    return data


def _graph_fields(f: BinaryIO):
    """The main graph's fields (field, wire type, value), as :func:`_fields` gives them; none without a graph."""
    size = f.seek(0, 2)
    f.seek(0)
    graph = next((v for fld, w, v in _fields(f, size) if fld == MODEL_GRAPH and w == LEN), None)
    if graph is None:
        return
    if graph[0] + graph[1] > size:
        raise ValueError("the graph runs past the end of the file")
    f.seek(graph[0])
    yield from _fields(f, graph[0] + graph[1])


def embedding_index_limits(path: Path) -> dict[str, int]:
    """Graph inputs used directly as row indices of a 2-D initializer (``Gather`` on axis 0) → its row count.
    Raises ValueError (or OSError) on a file that is not such a protobuf."""
    rows: dict[str, int] = {}
    inputs: set[str] = set()
    gathers: list[tuple[str, str, int]] = []
    with open(path, "rb") as f:
        for field, wire, val in _graph_fields(f):
            if wire != LEN:
                continue
            if field == GRAPH_INITIALIZER:
                dims, name = _tensor_dims_name(f, val)
                if len(dims) == 2:
                    rows[name] = dims[0]
            elif field == GRAPH_INPUT:
                inputs.update(_texts(_message(f, val).get(VALUE_INFO_NAME, [])))
            elif field == GRAPH_NODE:
                gathers.extend(_gather(_message(f, val)))
    out: dict[str, int] = {}
    for table, index, axis in gathers:
        if axis == 0 and table in rows and index in inputs - set(rows):
            out[index] = min(out.get(index, rows[table]), rows[table])
    return out


def graph_ops(path: Path) -> set[tuple[str, str]]:
    """(domain, op_type) of each node of the main graph (a subgraph's nodes, in an ``If`` or ``Loop``, are not
    read). Raises ValueError (or OSError) on a file that is not such a protobuf."""
    ops: set[tuple[str, str]] = set()
    with open(path, "rb") as f:
        for field, wire, val in _graph_fields(f):
            if field == GRAPH_NODE and wire == LEN:
                node = _message(f, val)
                domain, op = node.get(NODE_DOMAIN, [b""])[0], node.get(NODE_OP_TYPE, [b""])[0]
                ops.add((domain.decode("utf-8", "replace"), op.decode("utf-8", "replace")))
    return ops


def _gather(node: dict[int, list]) -> list[tuple[str, str, int]]:
    """(table, index, axis) of a two-input Gather node, else nothing."""
    if _texts(node.get(NODE_OP_TYPE, [])) != ["Gather"] or len(node.get(NODE_INPUT, [])) != 2:
        return []
    axis = 0
    for raw in node.get(NODE_ATTRIBUTE, []):
        attr = _parse(raw)
        if _texts(attr.get(ATTR_NAME, [])) == ["axis"] and attr.get(ATTR_I):
            axis = _signed(attr[ATTR_I][0])
    table, index = _texts(node[NODE_INPUT])
    return [(table, index, axis)]


def _texts(values: list[bytes]) -> list[str]:
    return [v.decode("utf-8", "replace") for v in values]
