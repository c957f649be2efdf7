"""The primitive: reference recurrence, chunk paths, autograd wiring, input checks."""
from .api import linear_attention
from .checks import set_value_checks
from .precision import set_precision
from .reference import reference_linear_attention

__all__ = ["linear_attention", "reference_linear_attention", "set_precision", "set_value_checks"]
