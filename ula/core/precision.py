"""Opt-in matmul precision of the Triton kernels for half-precision inputs (read by ula/core/triton/utils.py).

    states:    the state kernel's matmuls and the output kernel's q @ S in tf32, border states in float32
    own_block: decays per feature: the rows' own diagonal block (scores and their product with v) in tf32

Both trade speed for bf16 error against float64 (H100, benchmarks/RESULTS.md session 10: with both, GLA's error is
at or below fla's on the output and every gradient, at +16% time; states alone costs constant decay 2.3x).
Defaults from ULA_STATE_PRECISION / ULA_OWN_PRECISION ("tf32" on), changed at run time by `set_precision`."""
import os

_CHOICES = ("default", "tf32")
TF32 = {"states": os.environ.get("ULA_STATE_PRECISION") == "tf32",
        "own_block": os.environ.get("ULA_OWN_PRECISION") == "tf32"}


def set_precision(states=None, own_block=None):
    """Choose "tf32" or "default" (half-precision operands) for the states path and for the own diagonal block of
    decays per feature; None leaves a setting as it is. Returns the previous settings as a dict, which
    `set_precision(**previous)` restores. Applies to later calls (float16/bfloat16 inputs, Triton backend)."""
    previous = {k: ("tf32" if on else "default") for k, on in TF32.items()}
    for name, value in (("states", states), ("own_block", own_block)):
        if value is None:
            continue
        if value not in _CHOICES:
            raise ValueError(f"set_precision: {name} must be one of {_CHOICES} (or None to keep it), got {value!r}")
        TF32[name] = value == "tf32"
    return previous
