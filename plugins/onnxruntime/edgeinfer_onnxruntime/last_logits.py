"""The LM head at one position per row.

onnxruntime-genai's builder applies the LM head to every position of a run: a prefill of ``n`` tokens gives
``[batch, n, vocab]`` logits, though a step reads one row per sequence. With a Qwen-sized vocabulary (151,936)
that is most of a short prompt's time and a transient the plan does not hold: on a 2-layer random Qwen3 with
that vocabulary (w8a8), a 128-token prefill took 86.8 ms of which the LM head 75.4, and a 1,500-token one raised
the process's peak from 672 to 2,295 MiB (a 911 MB logits tensor, written twice). Here the hidden state the LM
head reads is gathered first, at ``last_index[r]`` of row ``r`` (``GatherND``, ``batch_dims=1``,
https://onnx.ai/onnx/operators/onnx__GatherND.html), so the head runs on ``[batch, 1, hidden]``.
"""

from __future__ import annotations

from pathlib import Path

INPUT = "last_index"  # int64 [batch, 1, 1]: the position, within the run's tokens, whose logits each row gives
HEADS = ("MatMul", "MatMulNBits")
# what the builder may put between the head and the logits (a bias, Gemma's soft-capping, a cast): each position
# on its own, so they run on the gathered rows as they did on all of them
POSITIONWISE = ("Add", "Sub", "Mul", "Div", "Tanh", "Cast")


def gather_last(graph: Path, logits: str) -> bool:
    """Rewrite ``graph`` (the builder's ONNX file, its weights left in their external file) so that its output
    ``logits`` is ``[batch, 1, vocab]`` at the positions the new input :data:`INPUT` names. False, the graph
    left as it is (every position's logits, which the decoder still reads), when ``logits`` does not come from
    a MatMul through position-wise nodes only."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(graph), load_external_data=False)
    g = model.graph
    made = {o: n for n in g.node for o in n.output if n.op_type != "Constant"}
    node = made.get(logits)
    while node is not None and node.op_type in POSITIONWISE:
        computed = [i for i in node.input if i in made]
        node = made[computed[0]] if len(computed) == 1 else None
    if node is None or node.op_type not in HEADS:
        return False
    hidden = node.input[0]
    picked = f"{hidden}/{INPUT}"
    node.input[0] = picked
    nodes = list(g.node)
    nodes.insert(nodes.index(node), helper.make_node("GatherND", [hidden, INPUT], [picked],
                                                     name=f"/lm_head/{INPUT}", batch_dims=1))
    del g.node[:]
    g.node.extend(nodes)
    g.input.append(helper.make_tensor_value_info(INPUT, TensorProto.INT64, ["batch_size", 1, 1]))
    dims = next(o for o in g.output if o.name == logits).type.tensor_type.shape.dim
    if len(dims) == 3:
        dims[1].Clear()
        dims[1].dim_value = 1
    onnx.save_model(model, str(graph))
    return True
