"""w8a16 on the ascend decoder: int8 in blocks per Linear, a tied LM head kept as the table, the recipe the
artifact records (and per channel for an artifact written before it did), and the plan of what it holds.

Expected blocks are worked out by hand from the layers' widths; expected bytes come from the planner
(`edgeinfer plan`), never from the decoder under test.
"""

from __future__ import annotations

import json

import pytest

from edgeinfer.errors import InputError
from edgeinfer.planning.planner import plan


def held_bytes(model) -> int:
    """What the model's parameters hold: torchao's int8 data and scales, else the tensor, tied ones once."""
    seen, total = set(), 0
    for p in model.parameters():  # parameters() yields a tied tensor once
        if id(p) in seen:
            continue
        seen.add(id(p))
        parts = (p.qdata, p.scale) if hasattr(p, "qdata") else (p,)
        total += sum(t.numel() * t.element_size() for t in parts)
    return total


def blocks(model) -> dict[str, int | None]:
    """Each Linear's block (its weight's torchao block width), None where it is not quantized."""
    import torch

    return {name: (list(m.weight.block_size)[-1] if hasattr(m.weight, "qdata") else None)
            for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


@pytest.fixture(scope="module")
def odd_widths():
    """A one-layer random Qwen3 whose rows are 96 wide (128 does not divide them, 32 does) and whose MLP's
    down projection reads 200 (no block of 32 or more divides it)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=96, intermediate_size=200, num_hidden_layers=1, num_attention_heads=3,
                         num_key_value_heads=1, head_dim=32, vocab_size=128, tie_word_embeddings=True)
    return Qwen3ForCausalLM(config).eval()


def test_each_linear_gets_the_block_its_rows_take_and_a_tied_head_stays_the_table(odd_widths):
    from edgeinfer_ascend import decoder_export

    decoder_export.quantize_int8(odd_widths, decoder_export.int8_recipe())
    got = blocks(odd_widths)
    layer = "model.layers.0."
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj"):
        assert got[layer + name] == 32, name  # 96 wide: 128 and 64 do not divide it
    assert got[layer + "mlp.down_proj"] == 200  # per channel: the row is one block
    assert got["lm_head"] is None
    assert odd_widths.lm_head.weight is odd_widths.model.embed_tokens.weight


def test_group_size_is_recorded_and_checked(ascend, llm_dir, tmp_path):
    out = tmp_path / "w8a16-g64"
    facts = ascend.convert_decoder(llm_dir, "w8a16", 64, out, group_size=64)
    manifest = json.loads((out / "ascend-decoder.json").read_text())
    assert manifest["int8"] == {"block": 64, "tied_head": "table"} and "blocks of 64" in facts["quant"]
    d = ascend.load_decoder(out, context=64)
    try:
        assert set(blocks(d.model).values()) == {64, None}  # 256- and 768-wide rows; the tied head
    finally:
        d.close()
    for bad in (100, 16, "x"):
        with pytest.raises(InputError, match="group_size must be a multiple of 32"):
            ascend.convert_decoder(llm_dir, "w8a16", 64, tmp_path / f"bad-{bad}", group_size=bad)
    with pytest.raises(InputError, match="scheme fp16 has none"):
        ascend.convert_decoder(llm_dir, "fp16", 64, tmp_path / "fp16-g64", group_size=64)


def test_an_artifact_without_a_recipe_loads_per_channel_as_it_was_checked(ascend, llm_dir, tmp_path):
    out = tmp_path / "w8a16-before"
    ascend.convert_decoder(llm_dir, "w8a16", 64, out)
    path = out / "ascend-decoder.json"
    manifest = json.loads(path.read_text())
    del manifest["int8"]  # as written before 2026-12-06
    path.write_text(json.dumps(manifest))
    d = ascend.load_decoder(out, context=64)
    try:
        assert set(blocks(d.model).values()) == {256, 768}  # every row one block, the LM head's too
        assert "per channel" in d.facts()["quant"]
    finally:
        d.close()


def test_the_plan_holds_what_the_npu_dtype_model_holds(ascend, llm_dir):
    """On an NPU a w8a16 decoder runs in fp16: the plan for a 910B board counts the int8 blocks with their
    float32 scales and the fp16 table (the tied head is that table); loaded here with dtype fp16."""
    d = ascend.load_decoder(llm_dir, context=64, scheme="w8a16", dtype="fp16", warmup=False)
    try:
        held = held_bytes(d.model)
    finally:
        d.close()
    planned = plan(llm_dir, "atlas-300i-a2-910b4", quant="w8a16", ctx=64, runtime="torch-npu").breakdown["weights"]
    norms = 4 * (2 * 256 + 2 * 64) * 2 + 256 * 2  # fp16 RMSNorm weights, planned at the int8 rate
    assert abs(held - planned) <= norms, (held, planned)
