from edgeinfer.testing import BackendConformance


class TestOnnxRuntimeConformance(BackendConformance):
    backend_name = "onnxruntime"
    board = "host"  # deploys through the host board profile (its backend: onnxruntime)
    rtol = 1e-5
    atol = 1e-5
