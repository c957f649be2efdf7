"""ula: Unified Linear Attention. One chunked primitive, forward and backward through the same function."""
from .core import linear_attention, reference_linear_attention, set_precision, set_value_checks
from .ops import *  # noqa: F401,F403  the families (ula/ops/__init__.py lists them)

__version__ = "0.1.0"
__all__ = ["linear_attention", "reference_linear_attention", "set_precision", "set_value_checks"]
__all__ += [n for n in dir() if not n.startswith("_") and n not in __all__ and n not in ("core", "ops")]
