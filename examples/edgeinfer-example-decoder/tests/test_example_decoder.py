from edgeinfer.testing import DecoderConformance


class TestExampleDecoderConformance(DecoderConformance):
    """The decoder kit on the test LLM shipped with edgeinfer (edgeinfer/testing/data/tiny-qwen3): greedy tokens
    equal transformers' own generate, chunked prefill, context limits, options."""

    backend_name = "example-decoder"
