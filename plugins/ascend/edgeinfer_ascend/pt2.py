"""Loading ``torch.export`` programs (``.pt2``) without running code from them.

``torch.export.load`` trusts its input (its docstring says so: "Never load data from an untrusted
source"). In torch 2.13 an archive can make it, or the program it returns, run code through:

* pickled payloads: weights and constants with ``use_pickle`` (``torch.load(weights_only=False)``),
  ``custom_obj_*`` / ``opaque_obj_*`` constants (``torch._C._pickle_load_obj`` / ``pickle.loads``),
  the legacy ``serialized_*.pt`` / ``data/weights/<model>.pt`` layouts, and the sample inputs, which
  fall back to ``weights_only=False`` when the safe load fails;
* ``guards_code``: Python source that ``ExportedProgram.module()`` passes to ``exec``;
* symbolic shapes: ``expr_str`` strings go through ``sympy.sympify``, i.e. ``eval``;
* node targets: any callable reachable as ``torch.<a>.<b>`` (``torch.os.system``) becomes a graph call;
* pytree specs whose context names a module to import (``__enum__``, ``defaultdict``);
* compiled AOTInductor shared libraries (``data/aotinductor/``).

So an archive is read with Python's ``zipfile``, every member is checked against the layout
``torch.export.save`` writes, pickled payloads and compiled code are refused, the graph is checked
(ATen/prims operators and symbolic-shape operators only, symbolic expressions from a small
vocabulary, plain containers in pytree specs, guards that are shape checks, sample inputs that
torch's ``weights_only`` unpickler reads), then guards code, node metadata and sample inputs are
dropped and torch loads a fresh archive rebuilt from exactly the bytes that were checked.
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
import zipfile
from typing import Any

from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import ModelError

_FIXED = ("archive_format", "archive_version", "byteorder")
_WRITER_OWNED = (".data/version", ".data/serialization_id")  # PyTorchFileWriter writes these itself
_TENSOR_MEMBER = re.compile(r"data/(weights/weight|constants/tensor)_\d+")
_MODEL = "model"  # torch.export.load returns the program of this name
_CONFIGS = {  # payload config -> the only file names its entries may point at
    "data/weights/model_weights_config.json": re.compile(r"weight_\d+"),
    "data/constants/model_constants_config.json": re.compile(r"tensor_\d+"),
}
_GRAPH = "models/model.json"
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"

_OP_TARGET = re.compile(r"torch\.ops\.(aten|prims)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
_DENIED_OPS = frozenset(["from_file"])  # reads any file the process can read into a tensor
_SYM_TARGETS = frozenset(
    [f"_operator.{n}" for n in ("eq", "ne", "le", "ge", "lt", "gt", "neg", "pos", "mul", "add", "sub", "floordiv",
                                "mod", "pow", "truediv", "and_", "or_", "lshift", "rshift")]
    + ["math.trunc"]
    + [f"torch.sym_{n}" for n in ("not", "int", "float", "ite", "max", "min", "sqrt")]
)
# names a torch.export symbolic expression may use (sympy srepr of shape expressions)
_EXPR_NAMES = frozenset(
    "Symbol Integer Float Rational Add Mul Pow Max Min Mod Abs Eq Ne Lt Le Gt Ge StrictLessThan StrictGreaterThan "
    "LessThan GreaterThan Equality Unequality And Or Not Piecewise ExprCondPair Tuple floor ceiling sqrt "
    "true false True False BooleanTrue BooleanFalse oo zoo nan Infinity NegativeInfinity IntInfinity "
    "NegativeIntInfinity int_oo Half One Zero NegativeOne integer positive negative nonnegative nonpositive "
    "real finite commutative zero nonzero even odd precision "
    "FloorDiv ModularIndexing Where PythonMod CleanDiv CeilToInt FloorToInt CeilDiv LShift RShift PowByNatural "
    "FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator TruncToFloat TruncToInt RoundToInt "
    "RoundDecimal ToFloat Identity".split()
)
_EXPR_TOKEN = re.compile(
    r"\s+|'[a-z]+[0-9]*'|'[0-9.eE+-]+'|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|[A-Za-z_][A-Za-z0-9_]*"
    r"|\*\*|[=!<>]=|[-+*/%(),=<>&|~]"
)
_SYMBOL_NAME = re.compile(r"[a-z]+[0-9]+")
_SPEC_TYPES = frozenset([None, "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict"])


class UnsafeProgram(ModelError):
    """A .pt2 archive holding something that could run code when loaded."""


def sanitized(data: bytes, name: str) -> bytes:
    """A copy of the torch.export archive ``data`` that torch loads without running code from it."""
    members = _members(data, name)
    graph = _json(members, _GRAPH, name)
    _check_graph(graph, name)
    _check_guards(graph.get("guards_code"), name)
    graph["guards_code"] = []  # exec'd by ExportedProgram.module(); edgeinfer checks feeds itself
    for cfg_name, files in _CONFIGS.items():
        if cfg_name in members:
            _check_payload_config(_json(members, cfg_name, name), files, name)
    if members.get(_SAMPLE_INPUTS):
        _check_sample_inputs(members[_SAMPLE_INPUTS], name)
    members[_GRAPH] = json.dumps(graph).encode()
    members[_SAMPLE_INPUTS] = b""  # example inputs: not needed to run the program, so torch never unpickles them
    return _rebuild(members)


def load(data: bytes, name: str):
    """The ``ExportedProgram`` in ``data``, loaded through :func:`sanitized`."""
    import torch

    clean = sanitized(data, name)
    try:
        return torch.export.load(io.BytesIO(clean))
    except Exception as e:
        raise ModelError(
            f"{name} is not a loadable torch.export program "
            f"({first_line(e, 160)}); "
            "write it with torch.export.save(torch.export.export(model, args), path)"
        ) from None


# --- the archive ------------------------------------------------------------------------------------


def _members(data: bytes, name: str) -> dict[str, bytes]:
    """Every member of the archive by its path below the archive's root folder; refuses unknown members."""
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
        infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError):
        raise ModelError(f"{name} is not a torch.export archive (not a zip file)") from None
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise UnsafeProgram(f"{name}: the archive lists a member twice; refusing it")
    roots = {n.split("/", 1)[0] for n in names}
    if len(roots) != 1 or any("/" not in n for n in names):
        raise UnsafeProgram(f"{name}: not the layout torch.export.save writes (one root folder); refusing it")
    out: dict[str, bytes] = {}
    for info in infos:
        rel = info.filename.split("/", 1)[1]
        if info.is_dir():
            continue
        if info.compress_type != zipfile.ZIP_STORED:  # torch writes stored members; no decompression bombs
            raise UnsafeProgram(f"{name}: archive member {rel!r} is compressed, which torch.export.save never does")
        if not _allowed_member(rel):
            raise UnsafeProgram(
                f"{name}: archive member {rel!r} is not a tensor or the JSON program "
                f"({_why(rel)}); refusing it: export the model again with torch.export.save"
            )
        try:
            out[rel] = z.read(info)
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as e:
            raise ModelError(f"{name}: archive member {rel!r} is unreadable ({e})") from None
    for required in (_GRAPH, "archive_format"):
        if required not in out:
            raise ModelError(f"{name} is not a torch.export archive (no {required}); write it with torch.export.save")
    return out


def _allowed_member(rel: str) -> bool:
    return (
        rel in _FIXED or rel in _WRITER_OWNED or rel in _CONFIGS or rel in (_GRAPH, _SAMPLE_INPUTS)
        or _TENSOR_MEMBER.fullmatch(rel) is not None
    )


def _why(rel: str) -> str:
    if rel.startswith("data/aotinductor/"):
        return "compiled AOTInductor code"
    if "custom_obj_" in rel or "opaque_obj_" in rel or rel.endswith((".pt", ".pkl", ".pickle")):
        return "a pickled Python object"
    if rel.startswith("models/"):
        return f"only the program named {_MODEL!r} is loaded"
    return "unknown member"


def _json(members: dict[str, bytes], rel: str, name: str) -> Any:
    try:
        return json.loads(members[rel])
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{name}: {rel} is not valid JSON ({e})") from None


def _check_payload_config(cfg: Any, files: re.Pattern[str], name: str) -> None:
    entries = cfg.get("config") if isinstance(cfg, dict) else None
    if not isinstance(entries, dict):
        raise ModelError(f"{name}: malformed payload config")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise UnsafeProgram(f"{name}: {fqn!r} is stored as a pickled object, not raw tensor bytes; refusing it")
        path = meta.get("path_name")
        if not isinstance(path, str) or files.fullmatch(path) is None:
            raise UnsafeProgram(f"{name}: {fqn!r} is stored as {path!r}, not a raw tensor; refusing it")


def _check_sample_inputs(blob: bytes, name: str) -> None:
    """Refuse example inputs that torch's restricted unpickler (``weights_only=True``) cannot read.

    torch would retry those with ``weights_only=False``; we drop them either way, but a file that
    needs more than tensors and containers there is not what ``torch.export.save`` writes.
    """
    import torch

    try:
        torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except Exception:
        raise UnsafeProgram(
            f"{name}: its sample inputs hold pickled Python objects that torch.load(weights_only=True) refuses, "
            "not just tensors; refusing it"
        ) from None


def _rebuild(members: dict[str, bytes]) -> bytes:
    from torch.export.pt2_archive import PT2ArchiveWriter

    buf = io.BytesIO()
    with PT2ArchiveWriter(buf) as w:
        for rel, blob in members.items():
            if rel not in _WRITER_OWNED:
                w.write_bytes(rel, blob)
    return buf.getvalue()


# --- the program ------------------------------------------------------------------------------------


def _check_graph(doc: Any, name: str) -> None:
    """Walk the serialized program: operators, symbolic expressions, pytree specs; strip node metadata."""
    if not isinstance(doc, dict) or not isinstance(doc.get("graph_module"), dict):
        raise ModelError(f"{name}: {_GRAPH} is not a serialized ExportedProgram")
    stack: list[Any] = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        if "target" in item and "inputs" in item:
            _check_target(item["target"], name)
            item["metadata"] = {}  # stack traces and source functions: resolved by name, never needed here
        for key, value in item.items():
            if key == "expr_str":
                _check_expr(value, name)
            elif key in ("in_spec", "out_spec"):
                _check_treespec(value, name)
            elif key == "as_operator":
                _check_target(value, name)
            elif key in ("as_custom_obj", "as_graph"):
                raise UnsafeProgram(f"{name}: the program uses {key[3:].replace('_', ' ')}s, which edgeinfer does "
                                    "not load")
            else:
                stack.append(value)


_GUARD_NODES = (
    ast.Expression, ast.Compare, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Constant, ast.Subscript, ast.Load, ast.Name,
    ast.Attribute, ast.Call,
)
_GUARD_ATTRS = frozenset(["size", "stride", "storage_offset", "shape", "dim"])


def _check_guards(guards: Any, name: str) -> None:
    """Guards are shape checks such as ``L['x'].size()[0] <= 4096``; anything else is refused.

    They are dropped before loading in any case (torch would ``exec`` them).
    """
    if guards in (None, []):
        return
    if not isinstance(guards, list) or not all(isinstance(g, str) for g in guards):
        raise ModelError(f"{name}: malformed guards_code")
    for g in guards:
        try:
            tree = ast.parse(g, mode="eval")
        except (SyntaxError, ValueError):
            tree = None
        ok = tree is not None and all(
            isinstance(n, _GUARD_NODES)
            and (not isinstance(n, ast.Name) or n.id == "L")
            and (not isinstance(n, ast.Attribute) or n.attr in _GUARD_ATTRS)
            and (not isinstance(n, ast.Call) or isinstance(n.func, ast.Attribute))
            for n in ast.walk(tree)
        )
        if not ok:
            raise UnsafeProgram(f"{name}: its guards code {g[:60]!r} is not a shape check; refusing it")


def _check_target(target: Any, name: str) -> None:
    if isinstance(target, str) and (target in _SYM_TARGETS or _OP_TARGET.fullmatch(target)) and "__" not in target:
        if target in _SYM_TARGETS or _is_op_overload(target):
            return
    raise UnsafeProgram(
        f"{name}: the program calls {str(target)[:80]!r}, which is not an ATen/prims operator; refusing it"
    )


def _is_op_overload(target: str) -> bool:
    import torch

    _, _, ns, op, overload = target.split(".")
    if op in _DENIED_OPS:
        return False
    try:
        obj = getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError):
        return False
    return isinstance(obj, torch._ops.OpOverload)


def _check_expr(expr: Any, name: str) -> None:
    if not isinstance(expr, str) or len(expr) > 10_000:
        raise UnsafeProgram(f"{name}: malformed symbolic shape expression")
    pos = 0
    while pos < len(expr):
        m = _EXPR_TOKEN.match(expr, pos)
        if m is None:
            raise UnsafeProgram(f"{name}: symbolic shape expression {expr[:60]!r} is not a shape formula; "
                                "refusing it")
        tok = m.group()
        if (tok[0].isalpha() or tok[0] == "_") and tok not in _EXPR_NAMES and not _SYMBOL_NAME.fullmatch(tok):
            raise UnsafeProgram(f"{name}: symbolic shape expression uses {tok[:40]!r}; refusing it")
        pos = m.end()
    _check_expr_size(expr, name)


# sympy computes constant parts of an expression exactly (Integer(10)**Integer(10)**Integer(12) never ends),
# so their size is bounded before torch hands the string to sympy.sympify
_EXPR_BITS = 1024  # constants and constant results: shapes are int64, symbolic bounds a little more
_EXPR_EXPONENT_BITS = 7  # constant exponents and shifts below 128, on symbols too (evaluated once shapes are known)
_EXPR_DEPTH = 64
_EXPR_POW = frozenset(["Pow", "PowByNatural", "FloatPow"])
_EXPR_SHIFT = frozenset(["LShift"])
_EXPR_PRODUCT = frozenset(["Mul"])
_DIGITS_BITS = 3.33  # bits per decimal digit, rounded up


def _check_expr_size(expr: str, name: str) -> None:
    """Refuse, without computing them, constants and constant results beyond ``_EXPR_BITS`` bits (power
    towers, long products, shifts), constant exponents of ``_EXPR_EXPONENT_BITS`` bits or more and nesting
    beyond ``_EXPR_DEPTH``. Sizes are upper bounds in bits; a symbolic part has none (None)."""

    def refuse(what: str) -> UnsafeProgram:
        return UnsafeProgram(f"{name}: symbolic shape expression {expr[:60]!r} {what}; refusing it")

    def bits(node: ast.AST, depth: int) -> float | None:
        if depth > _EXPR_DEPTH:
            raise refuse(f"is nested more than {_EXPR_DEPTH} deep")
        b = _bits(node, depth + 1)
        if b is not None and b > _EXPR_BITS:
            raise refuse(f"computes numbers beyond {_EXPR_BITS} bits")
        return b

    def power(base: float | None, exponent: ast.AST, depth: int) -> float | None:
        e = bits(exponent, depth)
        if e is None:  # a symbolic exponent: sympy keeps it unevaluated
            return None
        if e > _EXPR_EXPONENT_BITS:
            raise refuse(f"raises to or shifts by a constant beyond {2**_EXPR_EXPONENT_BITS - 1}")
        return None if base is None else base * 2.0**e

    def shift(left: ast.AST, right: ast.AST, depth: int) -> float | None:
        b, s = bits(left, depth), power(1.0, right, depth)
        return None if b is None or s is None else b + s

    def combine(product: bool, children: list[ast.AST], depth: int) -> float | None:
        sizes = [bits(c, depth) for c in children]
        known = [b for b in sizes if b is not None]
        total = sum(known) if product else max(known, default=0.0) + 1
        if total > _EXPR_BITS:
            raise refuse(f"computes numbers beyond {_EXPR_BITS} bits")
        return total if len(known) == len(sizes) else None

    def _bits(node: ast.AST, d: int) -> float | None:
        if isinstance(node, ast.Constant):
            return _literal_bits(node.value)
        if isinstance(node, ast.Name):
            return None
        if isinstance(node, (ast.Expression, ast.UnaryOp)):
            return bits(node.body if isinstance(node, ast.Expression) else node.operand, d)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                return power(bits(node.left, d), node.right, d)
            if isinstance(node.op, ast.LShift):
                return shift(node.left, node.right, d)
            return combine(isinstance(node.op, ast.Mult), [node.left, node.right], d)
        if isinstance(node, ast.Call):
            fn = node.func.id if isinstance(node.func, ast.Name) else ""
            for k in node.keywords:
                bits(k.value, d)
            if fn in _EXPR_POW and len(node.args) == 2:
                return power(bits(node.args[0], d), node.args[1], d)
            if fn in _EXPR_SHIFT and len(node.args) == 2:
                return shift(node.args[0], node.args[1], d)
            result = combine(fn in _EXPR_PRODUCT, node.args, d)
            return None if fn == "Symbol" else result
        for child in ast.iter_child_nodes(node):  # comparisons, boolean operators, tuples
            bits(child, d)
        return 0.0 if isinstance(node, (ast.Compare, ast.BoolOp)) else None

    try:
        bits(ast.parse(expr, mode="eval"), 0)
    except (SyntaxError, ValueError, MemoryError):
        raise refuse("is not a shape formula") from None
    except RecursionError:
        raise refuse("is nested too deep") from None


def _literal_bits(value: Any) -> float:
    """An upper bound of the bits of a literal: a number, or a string sympy reads as one ('1e400')."""
    if isinstance(value, bool) or value is None:
        return 0.0
    if isinstance(value, int):
        return float(abs(value).bit_length())
    if isinstance(value, float):
        return 0.0 if not math.isfinite(value) else float(abs(int(value)).bit_length())
    if isinstance(value, str):
        mantissa, _, exponent = value.lower().partition("e")
        digits = sum(c.isdigit() for c in mantissa)
        try:
            scale = max(0, int(exponent)) if exponent else 0
        except ValueError:
            scale = 0
        return (digits + scale) * _DIGITS_BITS
    return 0.0


def _check_treespec(spec: Any, name: str) -> None:
    try:
        _protocol, root = json.loads(spec)
    except (TypeError, ValueError):
        raise UnsafeProgram(f"{name}: malformed input/output spec") from None
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or node.get("type") not in _SPEC_TYPES:
            kind = node.get("type") if isinstance(node, dict) else node
            raise UnsafeProgram(
                f"{name}: inputs/outputs use the container {str(kind)[:60]!r}; export a module that takes and "
                "returns tensors, tuples, lists or dicts"
            )
        ctx = node.get("context")
        try:
            ctx_val = json.loads(ctx) if isinstance(ctx, str) else ctx
        except ValueError:
            raise UnsafeProgram(f"{name}: malformed input/output spec") from None
        if ctx_val is not None and not (
            isinstance(ctx_val, list) and all(isinstance(k, (str, int)) for k in ctx_val)
        ):
            raise UnsafeProgram(f"{name}: input/output spec context {str(ctx)[:60]!r} is not plain keys; refusing it")
        stack.extend(node.get("children_spec") or [])
