from edgeinfer.testing import BackendConformance


class TestOnnxRuntimeConformance(BackendConformance):
    backend_name = "onnxruntime"
    rtol = 1e-5
    atol = 1e-5
