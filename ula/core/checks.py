"""Input checks for the public ops: every error names the argument, what it got and what it needs."""
import math
import numbers

import torch

from .cu_cache import host_values

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Value checks (a log decay must be finite and <= 0) read the data: on a GPU that waits for the whole queue
# of kernels, which stalls a training loop. Shapes, dtypes and devices are always checked; values always on
# the CPU, and on a GPU only after set_value_checks(True). Skipping them is safe: a positive log decay is
# still the recurrence's own math (no silent wrong answer), and a non-finite one gives non-finite outputs.
_VALUE_CHECKS_ON_GPU = [False]


def set_value_checks(on_gpu):
    """Check the values of log decays and gates of GPU tensors too (each check waits for the GPU)."""
    _VALUE_CHECKS_ON_GPU[0] = bool(on_gpu)


def check_values(x):
    """Whether the values of tensor x are checked now: never while torch.compile traces, always on the CPU."""
    if torch.compiler.is_compiling():
        return False
    return x.device.type == "cpu" or _VALUE_CHECKS_ON_GPU[0]
BACKENDS = ("auto", "torch", "triton", "reference")


def _desc(x):
    return f"shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}"


def check_device(name, x, device, op=None):
    """x on `device` (q's), else a ValueError naming the argument (and the op, for the families' own arguments,
    which the core would name by its internal ones or torch would fail on deep inside an op)."""
    if x.device != device:
        raise ValueError(f"{op + ': ' if op else ''}{name} must be on the device of q ({device}), got {x.device}")


def check_scale(scale, op=None):
    """scale: None (the default, K ** -0.5) or a finite real number."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"{op + ': ' if op else ''}scale must be a finite number or None (None means K ** -0.5), "
                        f"got {short_repr(scale)}{_python_number_hint(scale, 'float')}")


def _python_number_hint(x, kind):
    """For a number of another type (a NumPy or 0-d tensor scalar): which Python type to pass instead."""
    if isinstance(x, numbers.Number) and not isinstance(x, (bool, int, float)) or (
            isinstance(x, torch.Tensor) and x.dim() == 0):
        return f" (a {type(x).__module__}.{type(x).__name__}: pass a Python {kind}, {kind}(x))"
    return ""


def check_flag(op, name, x):
    if not isinstance(x, bool):
        raise TypeError(f"{op}: {name} must be True or False, got {short_repr(x)}")


def short_repr(x):
    """x for an error message: a tensor by its shape and dtype (its repr can run to pages), else repr(x)."""
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}, dtype {x.dtype}"
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."


def _tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_linear_attention(q, k, v, ld, rd, scale, initial_state, cu_seqlens, chunk_size, backend, key_gate=None):
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dims [B, T, H, D], got {_desc(x)}")
        if x.dtype not in FLOATS:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)} ([B, T, H, K]), got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] with B, T, H of q {tuple(q.shape[:3])}, got {tuple(v.shape)}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}), got {x.dtype}")
        check_device(name, x, q.device)
    B, T, H, K = q.shape
    V = v.shape[-1]
    if T == 0 or K == 0 or V == 0 or H == 0 or B == 0:
        raise ValueError(f"q, k, v need B, T, H, K, V >= 1, got q {tuple(q.shape)} and v {tuple(v.shape)}")
    _check_decay("ld", ld, q, [(H,), (B, T, H), (B, T, H, K)], "None, [H] (constant), [B, T, H] (scalar) or [B, T, H, K] (vector)")
    _check_decay("rd", rd, q, [(B, T, H, V)], "None or [B, T, H, V]")
    check_scale(scale)
    N = B
    if cu_seqlens is not None:
        _tensor("cu_seqlens", cu_seqlens)
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cu_seqlens must be an int32 or int64 tensor, got {cu_seqlens.dtype}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens must be 1-D [N + 1] with N >= 1 sequences, got shape {tuple(cu_seqlens.shape)}")
        if B != 1:
            raise ValueError(f"cu_seqlens needs the sequences packed along T with B == 1, got B = {B}")
        N = cu_seqlens.numel() - 1
        if torch.compiler.is_compiling():  # values are not known while tracing; checked in eager runs
            c = None
        else:
            c = list(host_values(cu_seqlens))
    if cu_seqlens is not None and c is not None:
        if c[0] != 0 or c[-1] != T:
            raise ValueError(f"cu_seqlens must start at 0 and end at T = {T}, got {c[0]} ... {c[-1]}")
        if any(b <= a for a, b in zip(c, c[1:])):
            raise ValueError(f"cu_seqlens must be strictly increasing (no empty sequences), got {c}")
    if initial_state is not None:
        _tensor("initial_state", initial_state)
        if tuple(initial_state.shape) != (N, H, K, V):
            what = "[N, H, K, V] (N sequences of cu_seqlens)" if cu_seqlens is not None else "[B, H, K, V]"
            raise ValueError(f"initial_state must be {what} = {(N, H, K, V)}, got {tuple(initial_state.shape)}")
        check_state_dtype(initial_state, q)
        check_device("initial_state", initial_state, q.device)
    check_chunk_backend(chunk_size, backend)
    check_key_gate(key_gate, q)


def check_state_dtype(state, q, op=None):
    """An initial state's dtype: float32, float64 too with float64 inputs (the dtype of the states a call returns)."""
    allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
    if state.dtype not in allowed:
        pre = f"{op}: " if op else ""
        raise TypeError(f"{pre}initial_state must be float32 (states are kept in float32; float64 too with float64 "
                        f"inputs), got {state.dtype}")


def check_chunk_backend(chunk_size, backend, op=None):
    pre = f"{op}: " if op else ""
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or chunk_size < 16 or chunk_size > 1024 or chunk_size & (chunk_size - 1)):
        raise ValueError(f"{pre}chunk_size must be None (chosen per backend) or a power of two from 16 to 1024, "
                         f"got {short_repr(chunk_size)}{_python_number_hint(chunk_size, 'int')}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"{pre}backend must be one of {BACKENDS}, got {short_repr(backend)}")


def check_key_gate(key_gate, q):
    """A log key gate: None or a finite float32/float64 [B, T, H] (B, T, H of q) on the device of q."""
    if key_gate is None:
        return
    _tensor("key_gate", key_gate)
    B, T, H = q.shape[:3]
    if tuple(key_gate.shape) != (B, T, H):
        raise ValueError(f"key_gate must be [B, T, H] = {(B, T, H)} (a log factor per step and head), "
                         f"got {tuple(key_gate.shape)}")
    if key_gate.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"key_gate (a log gate) must be float32 or float64, got {key_gate.dtype}")
    check_device("key_gate", key_gate, q.device)
    if check_values(key_gate) and not bool(torch.isfinite(key_gate).all()):
        raise ValueError("key_gate must be finite (it is the log of a factor on k)")


def _check_decay(name, g, q, shapes, what):
    if g is None:
        return
    _tensor(name, g)
    if tuple(g.shape) not in shapes:
        raise ValueError(f"{name} must be {what} = one of {shapes}, got {tuple(g.shape)}")
    allowed = (torch.float32, torch.float64)
    if g.dtype not in allowed:
        raise TypeError(f"{name} (log decay) must be float32 or float64 so cumulative sums keep their precision, got {g.dtype}")
    check_device(name, g, q.device)
    if not check_values(g):
        return
    bad = ~(torch.isfinite(g) & (g <= 0))
    if bool(bad.any()):
        idx = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"{name} is a log decay and must be finite and <= 0 (decay in (0, 1]); "
                         f"got {g[idx].item()} at index {idx}")
