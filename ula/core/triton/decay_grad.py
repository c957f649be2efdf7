"""Log-decay gradients on the GPU (the closed form of ula/core/decay_grad.py in one kernel):
    d_u = sign · Σ_{t ≥ u, t in u's chunk} (a_t ⊙ da_t − x_t ⊙ dx_t) + X_chunk(u)
in float32, one program per (feature tile, chunk, batch·head); rows are walked from the chunk's end with a
running carry. No float64 and no whole-sequence cumsum: the sum never leaves a chunk."""
import torch
import triton
import triton.language as tl

from .utils import alloc, block


@triton.jit
def _decay_grad_kernel(a, da, x, dx, X, out, starts, ends, T, H, D, n, sign,
                       C: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    i_d, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    cs = tl.load(starts + i_c)
    ce = tl.load(ends + i_c)
    cols = i_d * BD + tl.arange(0, BD)
    mcol = cols < D
    base = (i_b.to(tl.int64) * T * H + i_h) * D
    carry = tl.load(X + ((i_b.to(tl.int64) * H + i_h) * n + i_c) * D + cols, mask=mcol, other=0.0).to(tl.float32)
    for r in range(0, C, BR):
        rows = cs + (C - BR - r) + tl.arange(0, BR)
        m = (rows < ce)[:, None] & mcol[None, :]
        off = base + rows.to(tl.int64)[:, None] * (H * D) + cols[None, :]
        t = (tl.load(a + off, mask=m, other=0.0).to(tl.float32) * tl.load(da + off, mask=m, other=0.0).to(tl.float32)
             - tl.load(x + off, mask=m, other=0.0).to(tl.float32) * tl.load(dx + off, mask=m, other=0.0).to(tl.float32))
        t = t * sign
        tl.store(out + off, tl.cumsum(t, 0, reverse=True) + carry[None, :], mask=m)
        carry += tl.sum(t, 0)


def log_decay_grad_triton(a, da, x, dx, sign, X, layout, shape):
    """Same contract as ula.core.decay_grad.log_decay_grad (layout from chunk_layout)."""
    if torch.float64 in (a.dtype, da.dtype, x.dtype, dx.dtype):
        from ..decay_grad import log_decay_grad
        return log_decay_grad(a, da, x, dx, sign, X, layout, shape)
    starts, ends, _ = layout
    B, T, H, D = a.shape
    a, da, x, dx = (t.contiguous() for t in (a, da, x, dx))
    X = X.to(torch.float32).contiguous()
    n = X.shape[2]
    C = int((ends - starts).max()) if ends.numel() else 16
    C = triton.next_power_of_2(C)
    out = alloc((B, T, H, D), a.device)
    BR, BD = min(C, 32), block(D, 64, lo=16)
    grid = (triton.cdiv(D, BD), n, B * H)
    _decay_grad_kernel[grid](a, da, x, dx, X, out, starts, ends, T, H, D, n, float(sign), C=C, BR=BR, BD=BD)
    if len(shape) == 4:
        return out
    if len(shape) == 3:
        return out.sum(-1)
    return out.sum((0, 1, 3))
