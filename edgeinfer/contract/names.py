"""The backends the core names, as data: the only core module that spells a plugin's name
(tests/test_architecture.py checks; docs/architecture.md explains).

The core never branches on a backend's name: what differs between runtimes is part of the
contract (docs/writing-a-backend.md). These names are the few defaults a user would otherwise
have to type.
"""

from __future__ import annotations

#: the fp32 reference: golden checks compare against it, plain ``.onnx`` files load on it by
#: default, segmented deploys calibrate each segment on the outputs it computes
ENCODER_REFERENCE = "onnxruntime"
#: the decoder reference: runs a Hugging Face decoder directory by default (generate, chat, decoder golden)
DECODER_REFERENCE = "transformers"
#: the backend of the ``host`` board (this machine, measured at run time) and the source of its schemes
HOST_BACKEND = "onnxruntime"
HOST_SCHEMES_SOURCE = "https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html"
#: plugins that live in this repository's plugins/ (install hints point there)
BUNDLED_PLUGINS = ("onnxruntime", "openvino", "rknn", "ascend", "transformers", "llamacpp")
PLUGIN_INSTALL_HINT = "from a clone of edgeinfer: pip install ./plugins/onnxruntime (or ./plugins/openvino ...)"
PLUGINS_EXAMPLE = "onnxruntime,openvino"  # an EDGEINFER_PLUGINS value in messages
#: libraries whose logs, warnings and progress bars bury edgeinfer's one-line answer on stderr
NOISY_LOGGERS = ("torch", "torchao", "transformers", "nncf", "onnxscript", "openvino", "rknn", "huggingface_hub")
NOISY_MODULES = (r"(torch|torchao|transformers|nncf|onnx|onnxscript|onnxruntime|openvino|optimum|huggingface_hub)"
                 r"(\.|$)")
