"""Helpers shared by the families: the one-token recurrent step (one fused kernel on CUDA), gate dtypes, each packed
token's sequence."""
import contextlib

import torch

from ..core.backends import runs_triton
from ..core.cu_cache import cached
from ..core.time_scan import scan_time
from ._checks import check_float, check_step_qkv, check_step_state


def state_dtype(x):
    """States are float32, float64 only for float64 inputs (as in the core)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def recurrent_step(q, k, v, ld=None, rd=None, state=None, scale=None):
    """One step of the core recurrence (DESIGN §1) for decoding, in torch:

        S = diag(exp ld) S diag(exp rd) + k vᵀ,      o = scale · Sᵀ q

    q, k [B, H, K]; v [B, H, V]; ld None / [H] / [B, H] / [B, H, K]; rd None / [B, H, V];
    state [B, H, K, V] or None (zeros). Returns (o [B, H, V] with the dtype of v, new state)."""
    op = "recurrent_step"
    check_step_qkv(op, q, k, v, scale=scale)
    B, H, K = q.shape
    if ld is not None:
        shapes = {1: ((H,), "[H]"), 2: ((B, H), "[B, H]"), 3: ((B, H, K), "[B, H, K]")}
        shape, what = shapes.get(ld.dim() if isinstance(ld, torch.Tensor) else 3, shapes[3])
        check_float(op, "ld", ld, shape, what + " (None, [H], [B, H] or [B, H, K])", device=q.device)
    if rd is not None:
        check_float(op, "rd", rd, (B, H, v.shape[-1]), "None or [B, H, V]", device=q.device)
    check_step_state(op, state, (B, H, K, v.shape[-1]), device=q.device)
    return _step(q, k, v, ld, rd, state, scale)


def _step(q, k, v, ld=None, rd=None, state=None, scale=None):
    """recurrent_step without the checks (the ops check their own arguments, then call this). On CUDA, where no
    gradient is wanted (decoding), one Triton kernel does the whole step (ula/core/triton/step.py)."""
    B, H, K = q.shape
    dt = state_dtype(q)
    scale = K ** -0.5 if scale is None else scale
    if _fused_step_applies(dt, q, k, v, ld, rd, state):
        from ..core.triton.step import recurrent_step_triton
        out = state if _IN_PLACE[0] and state is not None and state.dtype == dt and state.is_contiguous() else None
        return recurrent_step_triton(q, k, v, ld, rd, state, scale, out=out)
    S = torch.zeros(B, H, K, v.shape[-1], dtype=dt, device=q.device) if state is None else state.to(dt)
    if ld is not None:
        lam = ld.to(dt).exp()
        shape = {1: lambda x: x.view(1, H, 1, 1), 2: lambda x: x[..., None, None], 3: lambda x: x[..., None]}
        lam = shape[ld.dim()](lam)
        S = lam * S
    if rd is not None:
        S = S * rd.to(dt).exp()[..., None, :]
    S = S + k.to(dt)[..., :, None] * v.to(dt)[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q.to(dt), S) * scale
    return o.to(v.dtype), S


_IN_PLACE = [False]


@contextlib.contextmanager
def states_updated_in_place():
    """Inside it, the fused CUDA step writes the new state into the state tensor it is given instead of a new
    one (decoding from preallocated buffers, Mixer.step_static: one copy per layer and token less). Only for
    callers that do not read the old state again."""
    prev, _IN_PLACE[0] = _IN_PLACE[0], True
    try:
        yield
    finally:
        _IN_PLACE[0] = prev


def _fused_step_applies(dt, *tensors):
    """CUDA with the Triton kernels (as backend="auto" picks them), float32 states, and no gradient to record
    (the kernel has no backward)."""
    q = tensors[0]
    if not q.is_cuda or dt != torch.float32:
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return False
    return runs_triton("auto", q.device)


def decay_dtype(q):
    """The dtype the core wants for log decays next to q."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


class PackedTokens:
    """Each token's place in a packed [1, T, ...] tensor (B == 1 with cu_seqlens), made from tensors alone (no read of
    cu_seqlens' values, so it traces with torch.compile): seq [T] its sequence, first [T] that sequence's first
    step, pos [T] its position in it, starts [T] whether it opens it; ends [N] each sequence's last step.
    Build it with `PackedTokens.of`, once per cu_seqlens tensor (ula/core/cu_cache.py)."""

    @classmethod
    def of(cls, cu_seqlens, T, device):
        if torch.compiler.is_compiling():  # a trace's tensors hold no values to keep
            return cls(cu_seqlens, T, device)
        return cached(cu_seqlens, ("packed_tokens", T, str(device)), lambda: cls(cu_seqlens, T, device))

    def __init__(self, cu_seqlens, T, device):
        cu = cu_seqlens.to(device=device, dtype=torch.long)
        self.seq = torch.repeat_interleave(torch.arange(cu.numel() - 1, device=device), cu[1:] - cu[:-1],
                                           output_size=T)
        self.first = cu[:-1][self.seq]
        self.pos = torch.arange(T, device=device) - self.first
        self.starts = self.pos == 0
        self.ends = cu[1:] - 1


def per_step(x, tokens):
    """A value per sequence, x [N, ...], at each of its steps: [1, T, ...] packed (tokens: PackedTokens), else
    [B, 1, ...] to broadcast over T (tokens None)."""
    return x.unsqueeze(1) if tokens is None else x[tokens.seq].unsqueeze(0)


def last_step(x, tokens):
    """x [B, T, ...] at each sequence's last step, [N, ...] (tokens: PackedTokens of a packed x, else None)."""
    return x[:, -1] if tokens is None else x[0, tokens.ends]


def cumsum_per_sequence(x, tokens):
    """x's cumsum along time (dim 1), restarted at each sequence's first step (tokens: PackedTokens of a packed x,
    else None): packed, one cumsum over all tokens less its value before the sequence, so no padding and no read of
    cu_seqlens' values. The subtraction cancels: take x in float64 where that matters."""
    total = scan_time(x, lambda y: y.cumsum(-1))
    return total if tokens is None else total - (total - x)[:, tokens.first]
