"""Log-decay gradients on the GPU (the closed form of ula/core/decay_grad.py in one kernel):
    d_u = sign · Σ_{t ≥ u, t in u's chunk} db_t + X_chunk(u),   db_t = a_t ⊙ da_t − x_t ⊙ dx_t
in float32, one program per (feature tile, chunk, batch·head); rows are walked from the chunk's end with a
running carry. No float64 and no whole-sequence cumsum: the sum never leaves a chunk.

db comes in precomputed, as slabs [P, B, T, H, Dp] that are summed: the output kernel writes them (its decay-
gradient epilogue) while it computes dq and dk, so neither is kept in float32. For a decay with one value per
step (scalar or constant) the slabs hold per-tile sums over features (Dp = 1) and X is summed over features too.
X (the border terms) comes as [B, H, n, P_x, D] slabs (per V tile of the state kernel), also summed here."""
import torch
import triton
import triton.language as tl

from .utils import alloc, block, cdiv, launch


@triton.jit
def _decay_grad_kernel(db, X, g, out, starts, ends, a, da, x, dx, T, H, D, DP, n, NP, NX, slab, sg_b, sg_t, sg_h,
                       sg_d, sign, floor, C: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, BDP: tl.constexpr,
                       SUM_D: tl.constexpr, BOUNDS: tl.constexpr, HAS_MASK: tl.constexpr, FORM: tl.constexpr):
    """FORM (per-feature decays): db_t = a_t ⊙ da_t − x_t ⊙ dx_t formed here from the four [B, T, H, D] tensors
    (contiguous, any float dtype), not read from slabs."""
    i_c, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # chunks on axis 0 (up to 2^31)
    i_b, i_h = i_bh // H, i_bh % H
    if BOUNDS:
        cs = tl.load(starts + i_c)
        ce = tl.load(ends + i_c)
    else:
        cs = i_c * C
        ce = tl.minimum(cs + C, T)
    cols = i_d * BD + tl.arange(0, BD)
    mcol = cols < D
    x_base = X + ((i_b.to(tl.int64) * H + i_h) * n + i_c) * NX * D
    carry = tl.zeros([BD], dtype=tl.float32)
    for p in range(NX):
        carry += tl.load(x_base + p * D + cols, mask=mcol, other=0.0)
    if SUM_D:
        carry = tl.sum(carry, 0)
    dcols = tl.arange(0, BDP)
    g_base = g + i_b.to(tl.int64) * sg_b + i_h * sg_h
    for r in range(0, C, BR):
        rows = cs + (C - BR - r) + tl.arange(0, BR)
        mr = rows < ce
        row_off = (i_b.to(tl.int64) * T + rows) * H + i_h  # [B, T, H] index of each row
        if SUM_D:
            m = mr[:, None] & (dcols < DP)[None, :]
            t = tl.zeros([BR], dtype=tl.float32)
            slab_ptr = db
            for _ in range(NP):  # pointer steps: slab counts can pass 2^31 elements
                t += tl.sum(tl.load(slab_ptr + row_off[:, None] * DP + dcols[None, :], mask=m, other=0.0), 1)
                slab_ptr += slab
            t = t * sign
            val = tl.cumsum(t, 0, reverse=True) + carry
            if HAS_MASK:  # the floor's gradient is zero (autograd.py)
                val = tl.where(tl.load(g_base + rows.to(tl.int64) * sg_t, mask=mr, other=0.0) > floor, val, 0.0)
            tl.store(out + row_off, val, mask=mr)
        else:
            m = mr[:, None] & mcol[None, :]
            off = row_off[:, None] * D + cols[None, :]
            if FORM:
                t = (tl.load(a + off, mask=m, other=0.0).to(tl.float32) * tl.load(da + off, mask=m, other=0.0)
                     - tl.load(x + off, mask=m, other=0.0).to(tl.float32) * tl.load(dx + off, mask=m, other=0.0))
            else:
                t = tl.zeros([BR, BD], dtype=tl.float32)
                slab_ptr = db
                for _ in range(NP):
                    t += tl.load(slab_ptr + off, mask=m, other=0.0)
                    slab_ptr += slab
            t = t * sign
            val = tl.cumsum(t, 0, reverse=True) + carry[None, :]
            if HAS_MASK:
                gv = tl.load(g_base + rows.to(tl.int64)[:, None] * sg_t + cols[None, :] * sg_d, mask=m, other=0.0)
                val = tl.where(gv > floor, val, 0.0)
            tl.store(out + off, val, mask=m)
        carry += tl.sum(t, 0)


def decay_grad_from_terms(db, X, sign, shape, T, C, n, bounds=None, g_mask=None, floor=0.0, products=None):
    """Gradient of a log decay of shape `shape` ([H], [B, T, H] or [B, T, H, D]) from the per-step terms db
    (float32 [P, B, T, H, Dp], summed over P; Dp = 1 or D) and the border terms X (float32 [B, H, n, P_x, D]).
    products = (a, da, x, dx), contiguous [B, T, H, D], for a per-feature decay: db = a ⊙ da − x ⊙ dx formed in
    the kernel instead (db is None then).

    Chunks are [i C, (i + 1) C) of every row unless bounds = (starts, ends) int32 [n] say otherwise (varlen).
    g_mask: the log decay as given, canonical [B|1, T, H, D|1] view: where it is at or below `floor` the
    gradient is 0 (not applied for a constant decay: the caller masks its [H] sum)."""
    form = products is not None
    P, B, T_, H, DP = (1,) + tuple(products[0].shape) if form else db.shape
    D = X.shape[-1]
    sum_d = len(shape) < 4
    out = alloc((B, T, H) if sum_d else (B, T, H, D), X.device)
    BD = block(D, 256 if sum_d else 64, lo=16)
    BR = min(C, 32 if BD <= 64 else 16)
    has_mask = g_mask is not None and len(shape) > 1
    g = g_mask if has_mask else X
    sg = g.stride() if has_mask else (0, 0, 0, 0)
    starts, ends = bounds if bounds is not None else (X, X)
    grid = (n, cdiv(D, BD), B * H)
    assert not (form and sum_d), "products are for per-feature decays"
    a, da, x, dx = products if form else (X, X, X, X)
    launch(_decay_grad_kernel, grid, X if form else db, X, g, out, starts, ends, a, da, x, dx, T, H, D, DP, n, P,
           X.shape[3], B * T * H * DP, *sg, float(sign), float(floor), C=C, BR=BR, BD=BD, BDP=block(DP, 256, lo=1),
           SUM_D=sum_d, BOUNDS=bounds is not None, HAS_MASK=has_mask, FORM=form)
    return out.sum((0, 1)) if len(shape) == 1 else out


def log_decay_grad_triton(a, da, x, dx, sign, X, layout, shape):
    """Same contract as ula.core.decay_grad.log_decay_grad (layout from chunk_bounds); the path of a backward
    that is not fused (a right decay): db is formed here."""
    if torch.float64 in (a.dtype, da.dtype, x.dtype, dx.dtype):
        from ..decay_grad import log_decay_grad
        return log_decay_grad(a, da, x, dx, sign, X, layout, shape)
    B, T, H, D = a.shape
    X = X.to(torch.float32).contiguous().unsqueeze(3)
    bounds = (layout.starts, layout.ends)
    if len(shape) == 4:  # per feature: the four products read in the kernel (no float32 copies of them)
        products = tuple(t.contiguous() for t in (a, da, x, dx))
        return decay_grad_from_terms(None, X, sign, shape, T, layout.C, X.shape[2], bounds=bounds,
                                     products=products)
    # contiguous: the product takes the layout of a strided input (q transposed from [B, H, T, K]), the kernel reads
    # [B, T, H, D] rows
    db = (a.float() * da.float() - x.float() * dx.float()).contiguous().unsqueeze(0)
    return decay_grad_from_terms(db, X, sign, shape, T, layout.C, X.shape[2], bounds=bounds)
