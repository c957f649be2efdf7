"""Helpers shared by the families: the one-token recurrent step (one fused kernel on CUDA), gate dtypes, packed
<-> padded layout."""
import contextlib
import weakref

import torch

from ..core.backends import runs_triton
from ..core.cu_cache import cached, host_values
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
    check_step_qkv(op, q, k, v)
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


def token_sequences(cu_seqlens, T, device):
    """(cu_seqlens as int64 on device, the sequence of each of the T packed tokens [T]), made on the device: no read
    of cu_seqlens' values on the host."""
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    return cu, torch.repeat_interleave(torch.arange(cu.numel() - 1, device=device), cu[1:] - cu[:-1], output_size=T)


class PackedLayout:
    """Maps per-token tensors between the core's layout [B, T, H, ...] (B == 1 packed with cu_seqlens)
    and a padded one [N, L, H, ...] with one row per sequence, so per-sequence scans (cumsum, cummax,
    logcumsumexp) are plain ops along dim 1. Without cu_seqlens both layouts are the same.
    Build it with `PackedLayout.of`, which makes it once per cu_seqlens tensor (ula/core/cu_cache.py)."""

    @classmethod
    def of(cls, cu_seqlens, T, device, narrow=False):
        """narrow: the caller pads only narrow tensors ([B, T, H] at most) or none, so that in a torch.compile trace,
        which cannot read cu_seqlens' values, every row may be padded to T steps (N times the packed size)."""
        if cu_seqlens is None:
            return cls(None, T, device)
        if narrow and torch.compiler.is_compiling():
            return cls(cu_seqlens, T, device, longest=T)
        return cached(cu_seqlens, ("packed_layout", T, str(device)), lambda: cls(cu_seqlens, T, device))

    def __init__(self, cu_seqlens, T, device, longest=None):
        """longest: the padded rows' length, by default the longest sequence's (read on the host at the first pad:
        a caller that only maps tokens, like the softmax layer, never waits for the GPU here)."""
        self.packed = cu_seqlens is not None
        if not self.packed:
            return
        self._cu = weakref.ref(cu_seqlens)  # weak: the cache's values must not keep cu_seqlens alive
        cu, self.seq = token_sequences(cu_seqlens, T, device)
        lens = cu[1:] - cu[:-1]
        self.N, self._L = lens.numel(), longest
        self.pos = torch.arange(T, device=device) - cu[:-1][self.seq]
        self.lens = lens

    @property
    def L(self):
        if self._L is None:
            cu = self._cu()
            if cu is None:  # an internal contract: the caller holds cu_seqlens while it uses the layout
                raise RuntimeError("PackedLayout: its cu_seqlens tensor was freed before the first pad")
            bounds = host_values(cu)  # once per cu_seqlens tensor (ula/core/cu_cache.py)
            self._L = max(e - s for s, e in zip(bounds, bounds[1:]))
        return self._L

    def pad(self, x, fill=0.0):
        if not self.packed:
            return x
        out = x.new_full((self.N, self.L) + tuple(x.shape[2:]), fill)
        return out.index_put((self.seq, self.pos), x[0])

    def unpad(self, x):
        return x if not self.packed else x[self.seq, self.pos].unsqueeze(0)

    def last_of(self, x):
        """Value at the last step of each sequence, [N, ...], from the padded layout."""
        if not self.packed:
            return x[:, -1]
        return x[torch.arange(self.N, device=x.device), self.lens - 1]
