"""alignflow: training-precision alignment experiments across hardware (MindSpore/MindFormers vs Megatron-LM)."""

__version__ = "0.1.0"
