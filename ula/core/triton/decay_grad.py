"""Log-decay gradients on the GPU (the closed form of ula/core/decay_grad.py in one kernel):
    d_u = sign · Σ_{t ≥ u, t in u's chunk} (a_t ⊙ da_t − x_t ⊙ dx_t) + X_chunk(u)
in float32, one program per (feature tile, chunk, batch·head); rows are walked from the chunk's end with a
running carry. No float64 and no whole-sequence cumsum: the sum never leaves a chunk. For a decay with one
value per step (scalar or constant) the sum over features happens here too, so no [B, T, H, D] buffer."""
import torch
import triton
import triton.language as tl

from .utils import alloc, block


@triton.jit
def _decay_grad_kernel(a, da, x, dx, X, out, starts, ends, T, H, D, n, sign,
                       C: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, SUM_D: tl.constexpr):
    i_c, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # chunks on axis 0 (up to 2^31)
    i_b, i_h = i_bh // H, i_bh % H
    cs = tl.load(starts + i_c)
    ce = tl.load(ends + i_c)
    cols = i_d * BD + tl.arange(0, BD)
    mcol = cols < D
    base = (i_b.to(tl.int64) * T * H + i_h) * D
    carry = tl.load(X + ((i_b.to(tl.int64) * H + i_h) * n + i_c) * D + cols, mask=mcol, other=0.0).to(tl.float32)
    if SUM_D:
        carry = tl.sum(carry, 0)
    for r in range(0, C, BR):
        rows = cs + (C - BR - r) + tl.arange(0, BR)
        mr = rows < ce
        m = mr[:, None] & mcol[None, :]
        off = base + rows.to(tl.int64)[:, None] * (H * D) + cols[None, :]
        t = (tl.load(a + off, mask=m, other=0.0).to(tl.float32) * tl.load(da + off, mask=m, other=0.0).to(tl.float32)
             - tl.load(x + off, mask=m, other=0.0).to(tl.float32) * tl.load(dx + off, mask=m, other=0.0).to(tl.float32))
        t = t * sign
        if SUM_D:  # out is [B, T, H]
            t = tl.sum(t, 1)
            row_off = i_b.to(tl.int64) * T * H + i_h + rows.to(tl.int64) * H
            tl.store(out + row_off, tl.cumsum(t, 0, reverse=True) + carry, mask=mr)
        else:
            tl.store(out + off, tl.cumsum(t, 0, reverse=True) + carry[None, :], mask=m)
        carry += tl.sum(t, 0)


def log_decay_grad_triton(a, da, x, dx, sign, X, layout, shape):
    """Same contract as ula.core.decay_grad.log_decay_grad (layout from chunk_layout)."""
    if torch.float64 in (a.dtype, da.dtype, x.dtype, dx.dtype):
        from ..decay_grad import log_decay_grad
        return log_decay_grad(a, da, x, dx, sign, X, layout, shape)
    B, T, H, D = a.shape
    a, da, x, dx = (t.contiguous() for t in (a, da, x, dx))
    X = X.to(torch.float32).contiguous()
    n = X.shape[2]
    sum_d = len(shape) < 4
    out = alloc((B, T, H) if sum_d else (B, T, H, D), a.device)
    BD = block(D, 256 if sum_d else 64, lo=16)
    BR = min(layout.C, 32 if BD <= 64 else 16)
    grid = (n, triton.cdiv(D, BD), B * H)
    _decay_grad_kernel[grid](a, da, x, dx, X, out, layout.starts, layout.ends, T, H, D, n, float(sign), C=layout.C,
                             BR=BR, BD=BD, SUM_D=sum_d)
    return out.sum((0, 1)) if len(shape) == 1 else out
