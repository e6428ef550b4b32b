"""Small ONNX models built with ``onnx.helper``, each with a NumPy reference.

They exercise what real models need from a backend: MatMul/Add/Relu with a
dynamic batch, a small attention block (MatMul, Softmax, Transpose), int64
inputs (Gather), and two inputs with two outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

OPSET = 17


@dataclass
class KitModel:
    name: str
    path: Path
    feeds: dict[str, np.ndarray]
    reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    gap: str | None = None  # the Backend.tensors.gaps key that, when declared, skips this model
    dynamic: bool = False  # has a symbolic batch dimension
    torch_module: Callable[[], Any] | None = None  # the same model as a torch.nn.Module, for .pt2 backends


def _save(graph, path: Path) -> Path:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="edgeinfer.testing")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _init(name: str, arr: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(arr, name)


def mlp(out_dir: Path, batch: int | str = "batch", seed: int = 0) -> KitModel:
    """y = relu(x @ W + b), x: [batch, 16] float32."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((16, 8)).astype(np.float32) * 0.5
    b = rng.standard_normal(8).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["xwb"]),
            helper.make_node("Relu", ["xwb"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])],
        [_init("W", w), _init("b", b)],
    )
    name = "mlp_dynamic" if isinstance(batch, str) else "mlp"
    n = 3 if isinstance(batch, str) else batch
    x = rng.standard_normal((n, 16)).astype(np.float32)
    return KitModel(
        name,
        _save(graph, out_dir / f"{name}.onnx"),
        {"x": x},
        lambda f: {"y": np.maximum(f["x"] @ w + b, 0)},
        gap="dynamic_shapes" if isinstance(batch, str) else None,
        dynamic=isinstance(batch, str),
        torch_module=lambda: _torch_classes()["mlp"](w, b),
    )


def attention(out_dir: Path, seq: int = 8, dim: int = 16, seed: int = 1) -> KitModel:
    """Single-head self-attention: softmax(Q K^T / sqrt(d)) V, x: [1, seq, dim] float32."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    wq, wk, wv = (rng.standard_normal((dim, dim)).astype(np.float32) * 0.3 for _ in range(3))
    scale = np.array(1 / np.sqrt(dim), dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "Wq"], ["q"]),
            helper.make_node("MatMul", ["x", "Wk"], ["k"]),
            helper.make_node("MatMul", ["x", "Wv"], ["v"]),
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["q", "kt"], ["s"]),
            helper.make_node("Mul", ["s", "scale"], ["ss"]),
            helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["y"]),
        ],
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])],
        [_init("Wq", wq), _init("Wk", wk), _init("Wv", wv), _init("scale", scale)],
    )

    def ref(f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = f["x"]
        q, k, v = x @ wq, x @ wk, x @ wv
        s = q @ k.transpose(0, 2, 1) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return {"y": p @ v}

    x = rng.standard_normal((1, seq, dim)).astype(np.float32)
    return KitModel(
        "attention", _save(graph, out_dir / "attention.onnx"), {"x": x}, ref, gap="attention",
        torch_module=lambda: _torch_classes()["attention"](wq, wk, wv, scale),
    )


def embedding(out_dir: Path, vocab: int = 32, dim: int = 8, seq: int = 6, seed: int = 2) -> KitModel:
    """Token embedding lookup: y = E[ids], ids: [1, seq] int64."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    table = rng.standard_normal((vocab, dim)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["y"], axis=0)],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])],
        [_init("E", table)],
    )
    ids = rng.integers(0, vocab, size=(1, seq), dtype=np.int64)
    return KitModel(
        "embedding", _save(graph, out_dir / "embedding.onnx"), {"ids": ids}, lambda f: {"y": table[f["ids"]]},
        gap="int64_inputs", torch_module=lambda: _torch_classes()["embedding"](table),
    )


def two_in_two_out(out_dir: Path, shape: tuple[int, ...] = (2, 4), seed: int = 3) -> KitModel:
    """sum = a + b, prod = a * b."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["prod"])],
        "two_in_two_out",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("a", "b")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("sum", "prod")],
    )
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("a", "b")}
    return KitModel(
        "two_in_two_out",
        _save(graph, out_dir / "two_in_two_out.onnx"),
        feeds,
        lambda f: {"sum": f["a"] + f["b"], "prod": f["a"] * f["b"]},
        gap="multiple_outputs",
        torch_module=lambda: _torch_classes()["two_in_two_out"](),
    )


def _torch_classes() -> dict[str, Any]:
    """The kit models as torch modules (same weights, same input names), for backends that take .pt2."""
    import torch

    def param(a: np.ndarray) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.from_numpy(np.array(a)), requires_grad=False)

    class Mlp(torch.nn.Module):
        def __init__(self, w, b):
            super().__init__()
            self.w, self.b = param(w), param(b)

        def forward(self, x):
            return torch.relu(x @ self.w + self.b)

    class Attention(torch.nn.Module):
        def __init__(self, wq, wk, wv, scale):
            super().__init__()
            self.wq, self.wk, self.wv = param(wq), param(wk), param(wv)
            self.scale = float(scale)

        def forward(self, x):
            q, k, v = x @ self.wq, x @ self.wk, x @ self.wv
            return torch.softmax(q @ k.transpose(1, 2) * self.scale, dim=-1) @ v

    class Embedding(torch.nn.Module):
        def __init__(self, table):
            super().__init__()
            self.table = param(table)

        def forward(self, ids):
            return self.table[ids]

    class TwoInTwoOut(torch.nn.Module):
        def forward(self, a, b):
            return a + b, a * b

    return {"mlp": Mlp, "attention": Attention, "embedding": Embedding, "two_in_two_out": TwoInTwoOut}


def export_pt2(model: KitModel, out_dir: Path) -> Path:
    """``model`` as a torch.export program (``.pt2``); a symbolic batch where the ONNX has one."""
    import torch

    assert model.torch_module is not None
    args = tuple(torch.from_numpy(model.feeds[n]) for n in model.feeds)
    dynamic = None
    if model.dynamic:
        batch = torch.export.Dim("batch", min=1, max=4096)
        dynamic = {n: {0: batch} for n in model.feeds}
    program = torch.export.export(model.torch_module().eval(), args, dynamic_shapes=dynamic)
    path = out_dir / f"{model.name}.pt2"
    torch.export.save(program, str(path))
    return path


def deep_stack(path: Path, layers: int = 12, dim: int = 32, batch: int | str = "batch", seed: int = 0) -> Path:
    """``layers`` residual blocks x + Relu(x @ W + b), nodes named /layers.N/..., then a head:
    the synthetic deep stack the paging tests and benchmark split at layer boundaries."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        p = f"/layers.{i}"
        inits += [numpy_helper.from_array((rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32),
                                          f"layers.{i}.weight"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(dim)).astype(np.float32), f"layers.{i}.bias")]
        nodes += [helper.make_node("MatMul", [x, f"layers.{i}.weight"], [f"{p}/mm"], name=f"{p}/MatMul"),
                  helper.make_node("Add", [f"{p}/mm", f"layers.{i}.bias"], [f"{p}/add"], name=f"{p}/Add"),
                  helper.make_node("Relu", [f"{p}/add"], [f"{p}/relu"], name=f"{p}/Relu"),
                  helper.make_node("Add", [x, f"{p}/relu"], [f"{p}/out"], name=f"{p}/Residual")]
        x = f"{p}/out"
    inits.append(numpy_helper.from_array(np.float32([0.5]), "head.scale"))
    nodes.append(helper.make_node("Mul", [x, "head.scale"], ["y"], name="/head/Mul"))
    graph = helper.make_graph(nodes, "deep_stack",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def token_model(path: Path) -> Path:
    """input_ids, attention_mask [batch, seq] int64 -> last_hidden_state [batch, seq, 1] = ids * mask, dynamic
    batch and sequence: a text-encoder-shaped model whose output shows which tokens and padding it saw."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
             helper.make_node("Cast", ["masked"], ["as_float"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["as_float", "axis"], ["last_hidden_state"])]
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
           for n in ("input_ids", "attention_mask")]
    out = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", 1])]
    return _save(helper.make_graph(nodes, "tokens", ins, out, [_init("axis", np.int64([2]))]), path)


def all_models(out_dir: Path) -> list[KitModel]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [mlp(out_dir, batch=2), mlp(out_dir), attention(out_dir), embedding(out_dir), two_in_two_out(out_dir)]
