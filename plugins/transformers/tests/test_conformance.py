from edgeinfer.testing import DecoderConformance


class TestTransformersReference(DecoderConformance):
    backend_name = "transformers"
