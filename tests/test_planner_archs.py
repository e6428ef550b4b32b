"""Architectures beyond llama/qwen: parameter counts against the published ones, KV bytes by hand.

Configs are the catalog entries (edgeinfer/planning/models/catalog/*.json, each copied from the model's
Hugging Face config.json, URL in its "source"). Published sizes are quoted with their source; every KV
figure is computed here by hand from the config values, not by the code under test.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgeinfer.cli import cli
from edgeinfer.cli.plan import plan_cmd
from edgeinfer.errors import InputError, ModelError
from edgeinfer.planning import planner
from edgeinfer.planning.models import catalog, resolve
from edgeinfer.planning.models.hf import spec_from_config

# (catalog name, published total parameters, where it is published)
PUBLISHED_TOTAL = [
    ("chatglm3-6b", 6.24e9, "https://huggingface.co/THUDM/chatglm3-6b (model size 6.24B params)"),
    ("glm-4-9b-chat", 9.40e9, "https://huggingface.co/THUDM/glm-4-9b-chat (model size 9.4B params)"),
    ("internlm2-chat-1.8b", 1.89e9, "https://huggingface.co/internlm/internlm2-chat-1_8b (1.89B params)"),
    ("internlm2-chat-7b", 7.74e9, "https://huggingface.co/internlm/internlm2-chat-7b (7.74B params)"),
    ("deepseek-v2-lite", 15.7e9, "https://github.com/deepseek-ai/DeepSeek-V2#model-downloads (Lite: 15.7B total)"),
    ("gemma-3-1b", 302e6 + 698e6, "arXiv:2503.19786 Table 1 (1B: 302M embedding + 698M non-embedding)"),
    ("gemma-3-4b", 417e6 + 675e6 + 3209e6, "arXiv:2503.19786 Table 1 (4B: 417M vision, 675M emb, 3,209M non-emb)"),
    ("qwen2-vl-2b", 2.21e9, "https://huggingface.co/Qwen/Qwen2-VL-2B-Instruct (model size 2.21B params)"),
    ("qwen2-vl-7b", 8.29e9, "https://huggingface.co/Qwen/Qwen2-VL-7B-Instruct (model size 8.29B params)"),
    ("qwen2.5-vl-3b", 3.75e9, "https://huggingface.co/Qwen/Qwen2.5-VL-3B-Instruct (model size 3.75B params)"),
    ("qwen2.5-vl-7b", 8.29e9, "https://huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct (model size 8.29B params)"),
]


@pytest.mark.parametrize(("name", "published", "where"), PUBLISHED_TOTAL, ids=[r[0] for r in PUBLISHED_TOTAL])
def test_parameter_count_matches_the_published_one(name: str, published: float, where: str) -> None:
    assert resolve(name).params_total == pytest.approx(published, rel=0.01), where


def test_minicpm_non_embedding_count_is_the_papers() -> None:
    # MiniCPM paper (arXiv:2404.06395) and model card: MiniCPM-2B has 2,442,057,984 non-embedding parameters
    s = resolve("minicpm-2b")
    assert s.params_total - s.embedding_params == pytest.approx(2_442_057_984, rel=0.001)
    assert s.tied_embeddings  # 2.7B with the (tied) 122,753 × 2304 table


def test_baichuan2_counts_by_hand() -> None:
    # Baichuan2 (arXiv:2309.10305 Table 2 shapes; W_pack = q,k,v of h×h each, untied NormHead lm_head)
    for name, h, inter, L, V in (("baichuan2-7b", 4096, 11008, 32, 125696),
                                 ("baichuan2-13b", 5120, 13696, 40, 125696)):
        per_layer = 4 * h * h + 3 * h * inter + 2 * h
        assert resolve(name).params_total == L * per_layer + h + 2 * V * h
    assert resolve("baichuan2-7b").params_total == pytest.approx(7.5e9, rel=0.01)  # "Baichuan 2-7B", 7.5B
    assert resolve("baichuan2-13b").params_total == pytest.approx(13.9e9, rel=0.01)


def test_deepseek_v2_lite_active_parameters() -> None:
    # README: 2.4B activated; by hand: attention 27 layers, 1 dense MLP, 26 MoE layers with 6 routed + 2 shared
    # experts of 3 × 2048 × 1408, router 64 × 2048, the lm_head (102400 × 2048) and the final norm
    h = 2048
    attn = h * 16 * 192 + h * 576 + 512 + 512 * 16 * 256 + 16 * 128 * h + 2 * h
    active = 27 * attn + 3 * h * 10944 + 26 * (8 * 3 * h * 1408 + 64 * h) + 102400 * h + h
    s = resolve("deepseek-v2-lite")
    assert s.params_active == active
    assert s.params_active == pytest.approx(2.4e9, rel=0.03)


# KV cache bytes per token (fp16, every layer at full context), by hand from each config
KV_PER_TOKEN = [
    ("chatglm3-6b", 28 * 2 * 2 * 128 * 2),  # multi-query: 2 groups of kv_channels 128
    ("glm-4-9b-chat", 40 * 2 * 2 * 128 * 2),
    ("internlm2-chat-7b", 32 * 2 * 8 * 128 * 2),
    ("baichuan2-13b", 40 * 2 * 40 * 128 * 2),  # ALiBi changes nothing in the cache
    ("minicpm-2b", 40 * 2 * 36 * 64 * 2),
    ("deepseek-v2-lite", 27 * (512 + 64) * 2),  # MLA: latent kv_lora_rank + decoupled rope key, no heads
    ("qwen2.5-vl-3b", 36 * 2 * 2 * 128 * 2),
    ("qwen2-vl-2b", 28 * 2 * 2 * 128 * 2),
]


@pytest.mark.parametrize(("name", "per_token"), KV_PER_TOKEN, ids=[r[0] for r in KV_PER_TOKEN])
def test_kv_bytes_per_token_by_hand(name: str, per_token: int) -> None:
    s = resolve(name)
    assert s.kv_bytes_per_token(2.0) == per_token
    assert planner.kv_bytes(s, 1000, 1, 2.0) == per_token * 1000


def test_gemma3_caches_sliding_layers_only_up_to_the_window() -> None:
    # gemma-3-1b: 26 layers, sliding_window_pattern 6 → layers 6, 12, 18, 24 (1-based) global = 4,
    # 22 sliding with window 512; 1 KV head × 256 × 2 (K,V) × 2 bytes = 1024 B per layer per token
    s = resolve("gemma-3-1b")
    assert planner.kv_bytes(s, 4096, 1, 2.0) == 1024 * (4 * 4096 + 22 * 512)
    assert planner.kv_bytes(s, 256, 1, 2.0) == 1024 * 26 * 256  # below the window every layer holds ctx
    # gemma-3-4b: 34 layers → 5 global (6, 12, 18, 24, 30), 29 sliding of 1024; 4 KV heads × 256 × 2 × 2 B
    assert planner.kv_bytes(resolve("gemma-3-4b"), 32768, 2, 2.0) == 2 * 4096 * (5 * 32768 + 29 * 1024)


def test_gemma3_layer_types_list_wins_over_the_pattern() -> None:
    cfg = dict(catalog()["gemma-3-1b"]["config"])
    cfg["layer_types"] = ["sliding_attention"] * 20 + ["full_attention"] * 6
    s = spec_from_config(cfg, "g", "test")
    assert planner.kv_bytes(s, 4096, 1, 2.0) == 1024 * (6 * 4096 + 20 * 512)


def test_qwen_vl_vision_tower_and_image_budget() -> None:
    s = resolve("qwen2-vl-7b")
    # Qwen2-VL paper (arXiv:2409.12191 Table 1): a 675M-parameter ViT for every size
    assert s.vision_params == pytest.approx(675e6, rel=0.01)
    assert s.params_total - s.params_active == s.vision_params + s.embedding_params  # never streamed per token
    # 448×448: 32×32 patches of 14 px, merged 2×2 → 256 LLM tokens
    assert s.vision["image"] == {"width": 448, "height": 448, "patches": 1024, "llm_tokens": 256}
    # activations by hand (fp32 rows): pixels + input rows + max(attention incl. 16 heads' 1024² scores, MLP)
    # + merged output rows
    n, e = 1024, 1280
    pixels = n * 3 * 2 * 14 * 14 * 4
    attn = n * 3 * e * 4 + 16 * n * n * 4
    mlp = n * (2 * e + 2 * 5120) * 4
    assert s.vision_activation_bytes == pixels + n * e * 4 + max(attn, mlp) + 256 * 3584 * 4


def run_cli(*args: str):
    cli.add_command(plan_cmd)  # edgeinfer.cli attaches it in main()
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_plan_cli_image_option_grows_the_activations() -> None:
    small = json.loads(run_cli("plan", "qwen2.5-vl-3b", "--board", "rk3588-16g", "--json").stdout)
    big = json.loads(run_cli("plan", "qwen2.5-vl-3b", "--board", "rk3588-16g", "--image", "1344x1344",
                             "--json").stdout)
    # 1344² → 96² = 9216 patches: the 16-head score matrix alone is 16 × 9216² × 4 bytes
    assert big["memory"]["breakdown"]["activations"] >= 16 * 9216**2 * 4
    assert small["memory"]["breakdown"]["activations"] < big["memory"]["breakdown"]["activations"]
    bad = run_cli("plan", "qwen3-0.6b", "--board", "rk3588-16g", "--image", "448x448")
    assert bad.exit_code == 2 and "no vision encoder" in bad.output
    assert run_cli("plan", "qwen2.5-vl-3b", "--board", "rk3588-16g", "--image", "big").exit_code == 2


def test_unknown_architecture_names_the_supported_ones(tmp_path) -> None:
    with pytest.raises(ModelError) as e:
        spec_from_config({"model_type": "mamba"}, "m", "test")
    line = e.value.one_line()
    assert "mamba" in line and all(a in line for a in ("chatglm", "deepseek_v2", "gemma3", "qwen2_5_vl"))


@pytest.mark.parametrize("name", ["chatglm3-6b", "deepseek-v2-lite", "gemma-3-4b", "qwen2.5-vl-7b", "minicpm-2b",
                                  "internlm2-chat-1.8b", "baichuan2-7b"])
def test_new_architectures_plan_end_to_end(name: str) -> None:
    p = planner.plan(name, "rk3576-8g", quant="w4a16", ctx=4096)
    assert p.breakdown["weights"] > 0 and p.breakdown["kv_cache"] > 0
    assert p.estimates.decode_tokens_per_s and p.estimates.decode_tokens_per_s > 0


def _write_safetensors(path, shapes: dict[str, list[int]]) -> None:
    """A float16 safetensors file of zeros (the format: 8-byte header length, JSON header, data)."""
    import struct

    header, off = {}, 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(off))


def test_unsupported_architecture_with_safetensors_is_planned_approximately(tmp_path) -> None:
    h, V, inter, kv_dim = 64, 1000, 256, 32  # 4 heads of 16 → 2 KV heads
    shapes: dict[str, list[int]] = {"model.embed_tokens.weight": [V, h], "model.norm.weight": [h],
                                    "lm_head.weight": [V, h]}
    for i in range(3):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": [h, h], p + "self_attn.k_proj.weight": [kv_dim, h],
                       p + "self_attn.v_proj.weight": [kv_dim, h], p + "self_attn.o_proj.weight": [h, h],
                       p + "mlp.gate_proj.weight": [inter, h], p + "mlp.up_proj.weight": [inter, h],
                       p + "mlp.down_proj.weight": [h, inter], p + "input_layernorm.weight": [h]})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "futurenet", "num_attention_heads": 4}))
    _write_safetensors(tmp_path / "model.safetensors", shapes)
    s = resolve(str(tmp_path))
    per_layer = 2 * h * h + 2 * kv_dim * h + 3 * inter * h + h
    assert s.params_total == 2 * V * h + h + 3 * per_layer
    assert s.layers == 3 and s.kv_bytes_per_token(2.0) == 3 * 2 * kv_dim * 2  # K and V rows, fp16
    # planned on RKLLM (rk3588's default runtime), not on a runtime whose export declares its architectures
    p = planner.plan(str(tmp_path), "rk3588-8g", quant="w8a8", ctx=100, kv_dtype="fp16")
    assert p.runtime == "rkllm" and p.breakdown["kv_cache"] == 3 * 2 * kv_dim * 2 * 100
    assert p.to_dict()["model"]["architecture"] == "futurenet (approximate)"
    assert any(w.startswith("approximate:") for w in p.warnings)
    # the host's onnxruntime backend (onnxruntime-genai's builder) exports a list of architectures: futurenet is
    # refused there (llama.cpp, the host's other decoder runtime, declares none: its converter decides at deploy)
    with pytest.raises(InputError, match=r"^board host: backend 'onnxruntime' exports .*, not 'futurenet'; "):
        planner.plan(str(tmp_path), "host", quant="fp16", ctx=100, kv_dtype="fp16", runtime="onnxruntime")
    # no safetensors: still the one-line refusal naming the supported architectures
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="supported: .*chatglm"):
        resolve(str(tmp_path))
