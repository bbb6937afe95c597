"""xpu-series: keep the sglang-xpu patch queue applied on a pinned upstream SGLang."""

__version__ = "0.1.0"
