"""The block sizes of the decoder conversions' MatMulNBits weights (standard library only: the backend class
declares them, and importing it must stay light)."""

from __future__ import annotations

from .matmul_f16 import unavailable

DEFAULT_BLOCK = 32  # the builder's default int4_block_size: w4a16's block
# w8a16 / w8a8's block: MLAS packs MatMulNBits' int8 weights with a float scale and a float block sum per block, so
# the loaded copy is 8 + 64/block bits per weight (1.25x the int8 at 32, 1.06x at 128); block 128 against 32 on the
# peer bench's random Qwen3: weights file 218.5 -> 201.3 MiB, worker after load 332 -> 281 MiB, not slower
# (bench/results/int8_block.json, docs/planner.md#served-decoder-memory)
INT8_BLOCK = 128
#: what convert() builds that no scheme name or option says: part of deploy's conversion cache key
#: (Decoders.defaults), so a conversion cached with another default is not reused
CONVERSION_DEFAULTS = {"int4_block_size": DEFAULT_BLOCK, "int8_block_size": INT8_BLOCK,
                       "w8a16_kernel": "int8 kernel, two activation digits",  # int8_digits.py
                       # what this machine builds: a conversion made where the op could not be built is not reused
                       # where it can, nor the other way round
                       "fp16": "fp16 panels of 32 (edgeinfer.MatMulF16)" if unavailable() is None  # matmul_f16.py
                       else "two int8 planes a weight",  # weight_planes.py
                       "lm_head": "one position per row",  # last_logits.py
                       "embedding": "int8 for int8 and int4 weights"}  # embedding.py
