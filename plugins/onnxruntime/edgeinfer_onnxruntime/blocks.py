"""The block sizes of the decoder conversions' int8 and int4 weights, and what else a conversion is keyed by
(standard library only: the backend class declares them, and importing it must stay light)."""

from __future__ import annotations

from .custom_ops import not_for_deploy

DEFAULT_BLOCK = 32  # w4a16's block: Q4_1's, and the builder's default int4_block_size
# w8a16 / w8a8's block: MLAS packs MatMulNBits' int8 weights with a float scale and a float block sum per block, so
# the loaded copy is 8 + 64/block bits per weight (1.25x the int8 at 32, 1.06x at 128); block 128 against 32 on the
# peer bench's random Qwen3: weights file 218.5 -> 201.3 MiB, worker after load 332 -> 281 MiB, not slower
# (bench/results/int8_block.json, docs/planner.md#served-decoder-memory)
INT8_BLOCK = 128
_OWN = not_for_deploy() is None  # custom_ops.py builds here, and deploy chooses it
#: what convert() builds that no scheme name or option says: part of deploy's conversion cache key
#: (Decoders.defaults), so a conversion cached with another default is not reused; the fp16, w8a16 and int4 entries
#: say what this machine builds, so a conversion made where the ops could not be built is not reused where they can
CONVERSION_DEFAULTS = {"int4_block_size": DEFAULT_BLOCK, "int8_block_size": INT8_BLOCK,
                       "w8a16_kernel": "int8 panels of 32 (edgeinfer.MatMulW8)" if _OWN  # custom_ops.py
                       else "int8 kernel, two activation digits",  # int8_digits.py
                       "int4_kernel": "int4 panels of 32, a block's fp16 scales and minimums side by "
                       "side (edgeinfer.MatMulW4; w4a8 on one digit), the LM head int8 (MatMulW8)" if _OWN
                       else "MatMulNBits",  # custom_ops.py
                       "fp16": "fp16 panels of 32 (edgeinfer.MatMulF16)" if _OWN  # custom_ops.py
                       else "two int8 planes a weight",  # weight_planes.py
                       "attention": "edgeinfer.GroupQueryAttention with an fp16 KV cache" if _OWN
                       else "com.microsoft.GroupQueryAttention",
                       "lm_head": "one position per row",  # last_logits.py
                       "embedding": "int8 for int8 and int4 weights" + (
                           "; a tied head's own-op weights" if _OWN else "")}  # embedding.py
