"""The fused-operator path, driven by a CPU stand-in for torch_npu's three fused kernels.

There is no NPU here. ``FusedOpsStandIn`` takes the place of the ``torch_npu`` module inside the
device module's :class:`~edgeinfer_ascend.device.NpuFusedOps` (the code that runs on the NPU), checks
every call against the documented shapes, layouts and argument conventions (Ascend Extension for
PyTorch API reference, hiascend.com, Pytorch 7.0.0: npu_rms_norm, npu_rotary_mul,
npu_fused_infer_attention_score), and computes the documented formulas in plain torch.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from edgeinfer_ascend.device import NpuFusedOps

from edgeinfer.testing.decoder_conformance import PROMPTS, reference_greedy


class FusedOpsStandIn:
    """Stand-in for ``torch_npu``'s fused kernels on CPU: documented checks + documented math."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def npu_rms_norm(self, x, gamma, epsilon=1e-6):
        self.calls["npu_rms_norm"] += 1
        assert gamma.dtype == x.dtype and tuple(gamma.shape) == tuple(x.shape[-1:]), (gamma.shape, x.shape)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
        return gamma * (x.float() * rstd).to(x.dtype), rstd

    def npu_rotary_mul(self, x, r1, r2, rotary_mode="half"):
        self.calls["npu_rotary_mul"] += 1
        b, s, n, d = x.shape  # BSND with r1 / r2 as BS1D
        assert rotary_mode == "half" and d % 2 == 0
        assert tuple(r1.shape) == tuple(r2.shape) == (b, s, 1, d), (r1.shape, x.shape)
        x1, x2 = torch.chunk(x, 2, -1)
        return r1 * x + r2 * torch.cat((-x2, x1), dim=-1)

    def npu_fused_infer_attention_score(self, query, key, value, *, atten_mask=None, num_heads=1, scale=1.0,
                                        input_layout="BSH", num_key_value_heads=0, **unused):
        self.calls["npu_fused_infer_attention_score"] += 1
        assert not unused, unused
        assert input_layout == "BSND"
        b, sq, n, d = query.shape
        _, skv, kvn, _ = key.shape
        assert n == num_heads and kvn == num_key_value_heads and n % kvn == 0
        assert tuple(value.shape) == tuple(key.shape) and key.shape[0] == b
        assert query.is_contiguous() and key.is_contiguous() and value.is_contiguous()
        # atten_mask: bool, True where a position is NOT attended, [B, 1, Sq, Skv]
        assert atten_mask.dtype == torch.bool and tuple(atten_mask.shape) == (b, 1, sq, skv)
        k = key.repeat_interleave(n // kvn, dim=2)
        v = value.repeat_interleave(n // kvn, dim=2)
        scores = torch.einsum("bqnd,bknd->bnqk", query.float(), k.float()) * scale
        scores = scores.masked_fill(atten_mask, float("-inf"))
        out = torch.einsum("bnqk,bknd->bqnd", scores.softmax(-1), v.float()).to(query.dtype)
        return out, None


@pytest.fixture(scope="module")
def fused(ascend, llm_dir):
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

    standin = FusedOpsStandIn()
    d = ascend.load_decoder(llm_dir, context=64, prefill_buckets=[16], fused=NpuFusedOps(standin, attention=True))
    with Generator(d, TextCodec(llm_dir)) as g:
        yield g, standin


def test_fused_path_gives_the_reference_tokens(fused, llm_dir):
    g, standin = fused
    assert g.decoder.ops.fused and "npu_fused_infer_attention_score" in g.decoder.ops.name
    for prompt in PROMPTS[:2]:
        ids = g.prompt_ids(prompt)
        assert g.generate(prompt, max_new_tokens=16).token_ids == reference_greedy(llm_dir, ids, 16)
    layers = 4  # tiny-qwen3
    steps = standin.calls["npu_fused_infer_attention_score"] // layers
    assert steps > 0 and standin.calls["npu_fused_infer_attention_score"] == steps * layers
    # per layer and step: input + post-attention norms and the per-head q/k norms (Qwen3); one final norm
    assert standin.calls["npu_rms_norm"] == steps * (4 * layers + 1)
    assert standin.calls["npu_rotary_mul"] == steps * 2 * layers


def test_fused_ops_are_refused_off_the_npu(ascend, llm_dir):
    from edgeinfer.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="fused Ascend operators"):
        ascend.load_decoder(llm_dir, context=16, fused=True)
