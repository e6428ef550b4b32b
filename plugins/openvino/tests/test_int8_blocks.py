"""INT8 weights in blocks (edgeinfer_openvino.int8_blocks): the rounding, and the IR the CPU plugin runs."""

from __future__ import annotations

import numpy as np
import pytest
from edgeinfer_openvino import int8_blocks

ov = pytest.importorskip("openvino")


def test_a_block_is_rounded_on_its_own_range_with_zero_on_the_grid() -> None:
    # range [-1, 1]: scale 2/255 held as fp16 (0.0078430176), zero point round(127.50) = 128
    q, scale, zero = int8_blocks.quantize(np.array([[-1.0, 0.0, 0.5, 1.0]], dtype=np.float32), 4)
    assert scale.dtype == np.float16 and float(scale[0, 0, 0]) == pytest.approx(2 / 255, rel=1e-3)
    assert int(zero[0, 0, 0]) == 128
    assert q.dtype == np.uint8 and q.tolist() == [[[0, 128, 192, 255]]]  # 1.0 would be 256: clipped


def test_blocks_round_closer_than_one_scale_a_row_where_a_row_holds_an_outlier() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, (64, 1024)).astype(np.float32)
    w[:, 7] = 0.5  # one large weight a row: a per-row scale is 25x coarser for the other 1023
    errors = {}
    for block in (128, 1024):
        q, scale, zero = int8_blocks.quantize(w, block)
        back = ((q.astype(np.float32) - zero) * scale.astype(np.float32)).reshape(w.shape)
        step = np.repeat(scale.astype(np.float32), block, axis=2).reshape(w.shape)
        assert np.all(np.abs(back - w) <= 0.75 * step)  # half a step, and the fp16 scale's own rounding
        errors[block] = float(np.sqrt(np.mean((back - w) ** 2)))
    assert errors[128] < errors[1024] / 2  # 7 of 8 blocks hold no outlier


def test_a_row_takes_the_largest_halving_of_the_block_that_divides_it() -> None:
    assert int8_blocks.row_block(2816, 256) == 256  # 11 blocks
    assert int8_blocks.row_block(896, 256) == 128  # Qwen2.5-0.5B's hidden size: 7 blocks of 128
    assert int8_blocks.row_block(96, 256) == 32
    assert int8_blocks.row_block(200, 128) == 200  # no block of 32 or more divides it: one block a row
    assert int8_blocks.row_block(4096, -1) == 4096  # group_size -1: a row
    assert int8_blocks.row_block(975, 100) == 975  # halved to 25, under 32: a row
    assert int8_blocks.row_block(96, 16) == 16  # a block asked for under 32 is kept


def test_the_plans_profile_holds_the_blocks_this_plugin_writes() -> None:
    from edgeinfer.contract.schemes import normalize_scheme
    from edgeinfer.planning.planner import runtime_profile
    from edgeinfer.planning.quant import block_of

    layout = runtime_profile("openvino-cpu")["int8_blocks"]
    assert layout["block"] == int8_blocks.BLOCK == 256 and layout["halve_to"] == int8_blocks.MIN_BLOCK
    for quant, block in (("w8a16", 256), ("w8a16_g128", 128)):  # the plan halves each row's block as written
        for k in (2816, 896, 576, 1536, 96, 200, 975, 4096):
            assert block_of(normalize_scheme(quant), layout, k) == int8_blocks.row_block(k, block), (quant, k)


def _model() -> tuple[object, dict[str, np.ndarray]]:
    from openvino import opset13 as ops

    rng = np.random.default_rng(1)
    w = {"up": rng.normal(0, 0.05, (384, 256)), "odd": rng.normal(0, 0.05, (96, 200)),
         "plain": rng.normal(0, 0.05, (256, 64)), "table": rng.normal(0, 0.05, (100, 384))}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    x = ops.parameter([-1, 256], np.float32, name="x")
    x2 = ops.parameter([-1, 200], np.float32, name="x2")
    ids = ops.parameter([-1], np.int64, name="ids")
    up = ops.matmul(x, ops.constant(w["up"]), False, True)
    odd = ops.matmul(x2, ops.constant(w["odd"]), False, True)
    plain = ops.matmul(x, ops.constant(w["plain"]), False, False)  # [K, N]: not a transpose_b weight
    table = ops.gather(ops.constant(w["table"]), ids, ops.constant(np.int64(0)))
    model = ov.Model([up, odd, plain, table], [x, x2, ids], "blocks")
    return model, w


# 256: "table"'s rows of 384 take blocks of 128
@pytest.mark.parametrize(("block", "rows", "smaller"), [(128, {"up": 128, "table": 128}, 0),
                                                       (256, {"up": 256, "table": 128}, 1)])
def test_the_cpu_plugin_runs_the_blocked_weights_as_written(block, rows, smaller) -> None:
    model, w = _model()
    done = int8_blocks.compress(model, block)
    # "odd": rows of 200, one block each
    assert (done["weights"], done["channel_wise"], done["group_size"], done["smaller_blocks"]) == \
        (3, 1, block, smaller)
    kinds = {op.get_type_name() for op in model.get_ordered_ops()}
    assert {"Subtract", "Multiply", "Reshape"} <= kinds
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                      "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    rng = np.random.default_rng(2)
    x, x2, ids = rng.normal(size=(3, 256)).astype(np.float32), rng.normal(size=(3, 200)).astype(np.float32), \
        np.array([0, 42, 99])
    up, odd, plain, table = compiled([x, x2, ids]).values()

    def back(name: str, size: int) -> np.ndarray:
        q, scale, zero = int8_blocks.quantize(w[name], size)
        return ((q.astype(np.float32) - zero) * scale.astype(np.float32)).reshape(w[name].shape)

    np.testing.assert_allclose(up, x @ back("up", rows["up"]).T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(odd, x2 @ back("odd", 200).T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(table, back("table", rows["table"])[ids], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(plain, x @ w["plain"], rtol=1e-5, atol=1e-5)  # left as it was
    assert 0 < np.abs(up - x @ w["up"].T).max() < 0.02  # int8 rounding: close to fp32, not equal


def test_the_ir_holds_one_byte_a_weight(tmp_path) -> None:
    model, w = _model()
    int8_blocks.compress(model, 128)
    ov.save_model(model, tmp_path / "m.xml", compress_to_fp16=False)
    fp32_bytes = sum(v.nbytes for v in w.values())
    held = (tmp_path / "m.bin").stat().st_size
    # 3 of 4 tensors at a byte a weight plus 3 bytes (fp16 scale, u8 zero point) a block; "plain" stays fp32
    assert held < 0.45 * fp32_bytes
