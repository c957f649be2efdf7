"""ula: Unified Linear Attention. One chunked primitive, forward and backward through the same function."""
from .core import linear_attention, reference_linear_attention

__version__ = "0.1.0"
__all__ = ["linear_attention", "reference_linear_attention"]
