"""STAND-IN for Rockchip's rkllm-toolkit (``rkllm``), for tests only: NOT the RKLLM toolkit."""
