"""Input checks for the family ops: each error names the op, the argument, what it got and what it needs.

The core checks q, k, v, cu_seqlens, chunk_size, backend and scale (`check_sequence`); these add the
family-specific arguments (gates, coefficients, state tuples) and the one-token `*_step` functions, which
never reach the core's checks. Shape, dtype and device checks read metadata only (every tensor must be on the
device of q); value checks (a log gate must be finite and <= 0) follow the core's policy
(ula.core.checks.check_values)."""
import math

import torch

from ..core.checks import check_device, check_linear_attention, check_scale, check_values, short_repr


def _desc(x):
    return f"shape {tuple(x.shape)}, dtype {x.dtype}"


def check_sequence(q, k, v, cu_seqlens=None, chunk_size=None, backend="auto", scale=None):
    """q, k [B, T, H, K], v [B, T, H, V], cu_seqlens, chunk_size, backend, scale: the core's own checks, run
    on the arguments as the user gave them (before any augmentation), so messages show the user's shapes."""
    check_linear_attention(q, k, v, None, None, scale, None, cu_seqlens, chunk_size, backend)


def num_sequences(q, cu_seqlens):
    return q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1


def check_float(op, name, x, shape, what, *, device, log_gate=False, nonneg=False, nonpos=False, finite=False):
    """x must be a floating tensor of exactly `shape` (what: its symbolic form, e.g. "[B, T, H, K]") on `device`
    (q's). log_gate / nonpos: finite and <= 0. nonneg: finite and >= 0. finite: finite."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a {what} = {tuple(shape)} floating-point torch.Tensor, "
                        f"got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{op}: {name} must be a floating-point tensor (float16, bfloat16, float32 or float64), "
                        f"got {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must be {what} = {tuple(shape)}, got {_desc(x)}")
    check_device(name, x, device, op)
    if (log_gate or nonneg or nonpos or finite) and check_values(x):
        bad = ~torch.isfinite(x)
        if log_gate or nonneg or nonpos:
            bad = bad | ((x < 0) if nonneg else (x > 0))
        if bool(bad.any()):
            idx = tuple(bad.nonzero()[0].tolist())
            need = ("a log gate, finite and <= 0 (gate in (0, 1])" if log_gate else
                    "finite and >= 0" if nonneg else "finite and <= 0" if nonpos else "finite")
            raise ValueError(f"{op}: {name} must be {need}; got {x[idx].item()} at index {idx}")


def check_state_tuple(op, state, parts, *, device, finite=()):
    """state: a tuple/list with len(parts) tensors on `device`; parts: [(name, shape, what)]; finite: the names
    of parts whose values must be finite (checked as the core checks values)."""
    names = ", ".join(f"{n} {w}" for n, _, w in parts)
    if not (isinstance(state, (tuple, list)) and len(state) == len(parts)):
        got = f"a {type(state).__name__} of length {len(state)}" if isinstance(state, (tuple, list)) \
            else type(state).__name__
        raise ValueError(f"{op}: initial_state / state must be a tuple ({names}), got {got}")
    for j, (x, (n, shape, what)) in enumerate(zip(state, parts)):
        check_float(op, f"state[{j}] ({n})", x, shape, what, device=device, finite=n in finite)


def check_number(op, name, x, *, positive=False, nonneg=False, what=""):
    """x: a finite real Python number (> 0 where positive, >= 0 where nonneg); what: its meaning, for the message."""
    bound = " > 0" if positive else " >= 0" if nonneg else ""
    need = f"{op}: {name} must be a finite number{bound}{what}, got {short_repr(x)}"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(need)
    if not math.isfinite(x) or (positive and x <= 0) or (nonneg and x < 0):
        raise ValueError(need)


def check_step_qkv(op, q, k, v, *, k_name="k", scale=None):
    """One-token inputs: q, k [B, H, K], v [B, H, V], floating, same dtype; scale None or a finite number."""
    check_scale(scale, op)
    for name, x in (("q", q), (k_name, k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{op}: {name} must have 3 dims [B, H, D] (one token), got {_desc(x)}")
        if not x.is_floating_point():
            raise TypeError(f"{op}: {name} must be a floating-point tensor, got {x.dtype}")
    if k is not None and tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"{op}: {k_name} must have the shape of q {tuple(q.shape)} ([B, H, K]), got {tuple(k.shape)}")
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"{op}: v must be [B, H, V] with B, H of q {tuple(q.shape[:2])}, got {tuple(v.shape)}")
    for name, x in ((k_name, k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{op}: {name} must have the dtype of q ({q.dtype}), got {x.dtype}")
        check_device(name, x, q.device, op)
    if 0 in tuple(q.shape) or v.shape[-1] == 0:
        raise ValueError(f"{op}: q, {k_name}, v need B, H, K, V >= 1, got q {tuple(q.shape)} and v {tuple(v.shape)}")


def check_step_state(op, state, shape, what="[B, H, K, V]", name="state", *, device):
    if state is not None:
        check_float(op, name, state, shape, what, device=device)
