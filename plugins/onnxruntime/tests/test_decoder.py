from edgeinfer.testing import DecoderConformance


class TestOnnxRuntimeDecoders(DecoderConformance):
    backend_name = "onnxruntime"
