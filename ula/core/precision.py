"""Matmul precision of the Triton kernels for half-precision inputs: which matmuls take tf32 (float32 tiles, 10
mantissa bits) instead of half-precision operands. Each part lowers the bf16 error against float64 at some cost in
time (H100, benchmarks/RESULTS.md "GPU, session 13"); none moves extra bytes except wide_states.

    own_block         decays per feature: the rows' own diagonal block (scores and their product with v)
    states_forward    the forward's state kernel (border states kept in the input dtype)
    states_backward   the backward's state kernels (the forward's states again, and the state gradients)
    q_states_backward the dK and dV passes' q @ S (their border states are float32 already where they are read)
    split_keys        decays per feature: the decayed keys' matmul with v as two bfloat16 matmuls (hi + lo parts)
    wide_states       every states matmul in tf32 with float32 border states (twice the border traffic; costly:
                      constant decay 2.3x, session 10; kept for studies)

Named settings: "fast" (no part), "accurate" (every part but wide_states). Each op has a measured default (the core:
states_forward for a constant decay, nothing otherwise; GLA "accurate"; GSA per pass, ula/ops/gsa.py PASS_PRECISION),
passed to the core as its `precision` argument. `set_precision` (or ULA_PRECISION at import) sets one choice for
every call instead; None goes back to each op's default."""
import contextlib
import os
import threading

PARTS = ("own_block", "states_forward", "states_backward", "q_states_backward", "split_keys", "wide_states")
PRESETS = {"fast": (), "accurate": PARTS[:-1]}


def parse(value, what="precision"):
    """A preset name, a comma-separated string or an iterable of PARTS -> a sorted tuple of parts; None -> None."""
    if value is None:
        return None
    given = value
    if isinstance(value, str):
        if value in PRESETS:
            return tuple(sorted(PRESETS[value]))
        value = [p for p in value.split(",") if p]
    try:
        parts = tuple(sorted(set(value)))
    except TypeError:
        parts = None
    if parts is None or any(p not in PARTS for p in parts):
        raise ValueError(f"{what} must be one of {tuple(PRESETS)}, parts from {PARTS} (a list or a comma-separated "
                         f"string), or None for each op's default; got {given!r}")
    return parts


_OVERRIDE = [parse(os.environ.get("ULA_PRECISION") or None, "ULA_PRECISION")]
# the parts of the core call running now, per thread (op.py sets them around its forward and backward; a backward
# runs on autograd's own thread)
_ACTIVE = threading.local()


def set_precision(precision):
    """One matmul precision for every later call with half-precision inputs on the Triton kernels: "fast",
    "accurate", or parts of PARTS; None goes back to each op's measured default. Returns the previous choice, which
    `set_precision(previous)` restores."""
    previous = _OVERRIDE[0]
    _OVERRIDE[0] = parse(precision, "set_precision: precision")
    return previous


def resolve(default):
    """The parts a call runs with: set_precision's choice where one is set, else the op's `default`."""
    return _OVERRIDE[0] if _OVERRIDE[0] is not None else (parse(default) or ())


def encode(parts):
    """Parts as one string (the custom op's schema takes no tuples of strings)."""
    return ",".join(parts)


def call_code(value, default, what):
    """The encoded parts a core call runs with, from its precision argument `value` (checked, error naming `what`;
    None: the op's `default`) and set_precision's override."""
    parts = parse(value, what)
    return encode(resolve(default if parts is None else parts))


@contextlib.contextmanager
def active(code):
    """The kernels launched inside take the parts in `code` (encode's string)."""
    before = getattr(_ACTIVE, "parts", ())
    _ACTIVE.parts = tuple(p for p in code.split(",") if p)
    try:
        yield
    finally:
        _ACTIVE.parts = before


def on(part):
    """Whether the core call running now takes `part`."""
    return part in getattr(_ACTIVE, "parts", ())
