"""The decoder kit on llama.cpp: the tiny test decoder converted by llama.cpp's own converter (once per session,
cached), its greedy tokens equal to transformers fp32 at F32 and F16 weights, the KV cache f16."""

from edgeinfer.testing import DecoderConformance

# llama.cpp gives each sequence n_ctx / n_seq_max cells padded to a multiple of 256 (src/llama-context.cpp):
# a context of 256 is allocated as it is, so kv_cache_bytes is that of the context
CONTEXT = 256


class TestLlamaCppF32(DecoderConformance):
    backend_name = "llamacpp"
    context = CONTEXT
    load_options = {"precision": "fp32"}
    kv_bytes_per_element = 2  # f16 KV, llama.cpp's default type_k / type_v


class TestLlamaCppF16(DecoderConformance):
    backend_name = "llamacpp"
    context = CONTEXT
    load_options = {"precision": "fp16"}
    kv_bytes_per_element = 2
