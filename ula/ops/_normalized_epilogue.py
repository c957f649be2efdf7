"""The epilogue of normalized linear attention on the Triton backend: one autograd Function, Triton kernels.

Per sequence (batch row, or each sequence of cu_seqlens), step t at position p = 0, 1, ... of its sequence:

    Z_t = z0 + Σ_{n<=t} v_n          C_t = c0 + p + 1
    den'_t = den_t + a C_t           d_t = clamp_sign(den'_t, eps)      (|d| >= eps, the sign kept, 0 positive)
    out_t = (o_t + a Z_t) / d_t      and the last Z, C of each sequence (the final state's last row)

Backward, from g_t = ∂L/∂out_t and ∂L/∂Z_T (∂L/∂C_T reaches c0 outside: C_T = c0 + length):

    dnum_t = g_t / d_t               do_t = dnum_t
    dden_t = -Σ_v dnum_t out_t       (0 where the clamp acts: -eps < den'_t < eps)
    dv_n = a Σ_{t>=n} dnum_t + ∂L/∂Z_T      dz0 = a Σ_t dnum_t + ∂L/∂Z_T      dc0 = a Σ_t dden_t
    da = Σ_t Σ_v dnum_t Z_t + Σ_t dden_t C_t

Sums over time run in chunks of CHUNK steps (chunks start at each sequence's first step: the core's chunk layout),
float32 throughout. Forward: chunk sums of v (1 read of v), an exclusive scan of those over each sequence's chunks
(tiny: [chunks, H, V]; its total is Z_T), then one kernel per (chunk, head) that adds the in-chunk cumulative sum,
combines and divides (reads v and o, writes out). Backward: chunk sums of dnum (reads dout), an inclusive reverse
scan of them (its total is dz0), then one kernel per (chunk, head) that recomputes Z and the output in float32 and
writes do, dden and dv (reads dout, o, v). The whole V of a head is one tile (rows in blocks), so the sum over V
of dden needs no second pass."""
import torch
from torch.autograd.function import once_differentiable
import triton
import triton.language as tl

from ..core.chunk_layout import make_layout
from ..core.triton.utils import alloc, block, cdiv, chunk_bounds, launch, tuned

# Steps per chunk, and (elements of a [rows, V] tile, warps) of the chunk kernels (forward and chunk sums;
# backward): the fastest of a sweep on an H200 at B2 T8192 H16 V128 bf16 (benchmarks/gpu_normalized_epilogue.py
# --sweep; benchmarks/results/pending16_h100_session16_part1.log has an H100 run, which agrees).
CHUNK = 64
_SCAN_BLOCK = 64  # chunks per step of the scan over a sequence's chunks
# The fused op's division backward was faster at 16384 elements (0.073 against 0.095 ms on an H100,
# benchmarks/results/normalized_fused_tiles_h100_session17.log) but spills 1.6 KB per thread there (two live
# 128 x 128 float32 tiles at 4 warps; tests/test_offline_compile.py allows 512 B): not taken. The fused op's tile and
# warps can be set with ULA_TUNE_DIVISION_BACKWARD="elements,warps" (sweeps).
_FWD, _BWD = (8192, 4), (8192, 4)


@triton.jit
def _coef(a, i_h, a_val, A_TENSOR: tl.constexpr):
    """a of head i_h: read from the [H] float32 tensor, or the number a_val."""
    if A_TENSOR:
        return tl.load(a + i_h)
    else:
        return a_val


@triton.jit
def _denominator(den, sd_t, rows, m, bos, c0v, av, eps, HAS_A: tl.constexpr):
    """(den + a C, its clamped form d, where the gradient passes the clamp) for a block of rows. den + a C is
    summed in float64 (one value per row, so it costs nothing): where it nears 0 it cancels, and float32 rounding
    of a C and of c0 + p + 1 would leave an error that 1/d multiplies (and dden's 1/d² doubles)."""
    dn = tl.load(den + rows.to(tl.int64) * sd_t, mask=m, other=1.0).to(tl.float32)
    if HAS_A:
        c = c0v.to(tl.float64) + (rows - bos + 1).to(tl.float64)
        dn = (dn.to(tl.float64) + av.to(tl.float64) * c).to(tl.float32)
    d = tl.where(dn >= 0, tl.maximum(dn, eps), tl.minimum(dn, -eps))
    return dn, d, (dn >= eps) | (dn <= -eps)


@triton.jit
def _chunk_sums_kernel(x, den, c0, a, out, cu, chunk_seq, chunk_start, T, H, V, n, a_val, eps,
                       sx_b, sx_t, sx_h, sx_v, sd_b, sd_t, sd_h,
                       C: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr,
                       DIVIDE: tl.constexpr, A_TENSOR: tl.constexpr, HAS_C0: tl.constexpr):
    """out[chunk, h] = Σ over the chunk's steps of x (forward: v), or of x / d (backward: dnum, x = dout)."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, cs, bos, ce = chunk_bounds(i_c, i_b, cu, chunk_seq, chunk_start, T, C, VARLEN)
    cols = tl.arange(0, BV)
    mc = cols < V
    xb = x + i_b.to(tl.int64) * sx_b + i_h * sx_h
    acc = tl.zeros([BV], dtype=tl.float32)
    if DIVIDE:
        av = _coef(a, i_h, a_val, A_TENSOR)
        c0v = 0.0
        if HAS_C0:
            c0v = tl.load(c0 + seq * H + i_h)
        db = den + i_b.to(tl.int64) * sd_b + i_h * sd_h
    for r in range(0, C, BR):
        rows = cs + r + tl.arange(0, BR)
        m = rows < ce
        xt = tl.load(xb + rows.to(tl.int64)[:, None] * sx_t + cols[None, :] * sx_v, mask=m[:, None] & mc[None, :],
                     other=0.0).to(tl.float32)
        if DIVIDE:
            _, d, _ = _denominator(db, sd_t, rows, m, bos, c0v, av, eps, True)
            xt = tl.where(m[:, None], xt / d[:, None], 0.0)
        acc += tl.sum(xt, 0)
    tl.store(out + ((i_b * n + i_c).to(tl.int64) * H + i_h) * V + cols, acc, mask=mc)


@triton.jit
def _scan_kernel(x, init, a, carry, total, chunk_offset, H, V, n, a_val,
                 NB: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr, REVERSE: tl.constexpr,
                 HAS_INIT: tl.constexpr, A_TENSOR: tl.constexpr, SCALE: tl.constexpr, EXCLUSIVE: tl.constexpr):
    """Over each sequence's chunks, y = SCALE ? a x : x (x [chunks, H, V]): forward, carry[j] = init + Σ_{i<j} y_i
    (exclusive); REVERSE, carry[j] = init + Σ_{i>=j} y_i (inclusive; with EXCLUSIVE Σ_{i>j}).
    total[seq] = init + Σ y."""
    i_s, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if VARLEN:
        f = tl.load(chunk_offset + i_s)
        m = tl.load(chunk_offset + i_s + 1) - f
    else:
        f = i_s * n
        m = n
    cols = i_v * BV + tl.arange(0, BV)
    mc = cols < V
    if HAS_INIT:
        acc = tl.load(init + (i_s * H + i_h).to(tl.int64) * V + cols, mask=mc, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros([BV], dtype=tl.float32)
    if SCALE:
        av = _coef(a, i_h, a_val, A_TENSOR)
    for j0 in range(0, m, NB):
        if REVERSE:
            idx = m - NB - j0 + tl.arange(0, NB)
            mi = idx >= 0
        else:
            idx = j0 + tl.arange(0, NB)
            mi = idx < m
        ptr = ((f + idx).to(tl.int64) * H + i_h)[:, None] * V + cols[None, :]
        mk = mi[:, None] & mc[None, :]
        y = tl.load(x + ptr, mask=mk, other=0.0)
        if SCALE:
            y = y * av
        if REVERSE:
            c = tl.cumsum(y, 0, reverse=True) + acc[None, :]
            if EXCLUSIVE:
                c -= y
        else:
            c = tl.cumsum(y, 0) - y + acc[None, :]
        tl.store(carry + ptr, c, mask=mk)
        acc += tl.sum(y, 0)
    tl.store(total + (i_s * H + i_h).to(tl.int64) * V + cols, acc, mask=mc)


@triton.jit
def _forward_kernel(o, den, v, carry, c0, a, out, cu, chunk_seq, chunk_start, T, H, V, n, a_val, eps,
                    so_b, so_t, so_h, so_v, sd_b, sd_t, sd_h, sv_b, sv_t, sv_h, sv_v,
                    C: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr,
                    HAS_A: tl.constexpr, A_TENSOR: tl.constexpr, HAS_C0: tl.constexpr):
    """out = (o + a Z) / clamp_sign(den + a C) over one chunk of one head, Z from the chunk's carry-in."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, cs, bos, ce = chunk_bounds(i_c, i_b, cu, chunk_seq, chunk_start, T, C, VARLEN)
    cols = tl.arange(0, BV)
    mc = cols < V
    ob = o + i_b.to(tl.int64) * so_b + i_h * so_h
    db = den + i_b.to(tl.int64) * sd_b + i_h * sd_h
    vb = v + i_b.to(tl.int64) * sv_b + i_h * sv_h
    outb = out + (i_b.to(tl.int64) * T * H + i_h) * V
    g = (i_b * n + i_c).to(tl.int64) * H + i_h
    av = 0.0
    c0v = 0.0
    if HAS_A:
        av = _coef(a, i_h, a_val, A_TENSOR)
        if HAS_C0:
            c0v = tl.load(c0 + seq * H + i_h)
        z = tl.load(carry + g * V + cols, mask=mc, other=0.0)
    for r in range(0, C, BR):
        rows = cs + r + tl.arange(0, BR)
        m = rows < ce
        mk = m[:, None] & mc[None, :]
        r64 = rows.to(tl.int64)[:, None]
        num = tl.load(ob + r64 * so_t + cols[None, :] * so_v, mask=mk, other=0.0).to(tl.float32)
        if HAS_A:
            x = tl.load(vb + r64 * sv_t + cols[None, :] * sv_v, mask=mk, other=0.0).to(tl.float32)
            num += av * (tl.cumsum(x, 0) + z[None, :])
            z += tl.sum(x, 0)
        _, d, _ = _denominator(db, sd_t, rows, m, bos, c0v, av, eps, HAS_A)
        y = num / d[:, None]
        tl.store(outb + r64 * (H * V) + cols[None, :], y.to(out.dtype.element_ty), mask=mk)


@triton.jit
def _backward_kernel(o, den, v, dout, carry_f, carry_b, c0, a, do, dden, dv, dden_sum, da_part, dnum_sums, rq, wq,
                     eq, edv, cu, chunk_seq, chunk_start, T, H, V, n, a_val, a_scale, eps,
                     so_b, so_t, so_h, so_v, sd_b, sd_t, sd_h, sv_b, sv_t, sv_h, sv_v,
                     C: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr,
                     HAS_A: tl.constexpr, A_TENSOR: tl.constexpr, HAS_C0: tl.constexpr, HAS_DV: tl.constexpr,
                     OUT_GIVEN: tl.constexpr, SUMS: tl.constexpr, INV_D: tl.constexpr, QR: tl.constexpr):
    """do, dden, dv (HAS_DV) of one chunk of one head (the module docstring's formulas), Σ dden and the chunk's
    share of da. carry_f: Z entering the chunk; carry_b: a Σ_{t >= chunk start} dnum_t + ∂L/∂Z_T.
    OUT_GIVEN: o is the output itself and den its whole denominator den + a C (the core divided,
    ula/ops/_normalized_fused.py); then HAS_A only asks for da. SUMS: the chunk's Σ dnum too. INV_D: do gets 1 / d
    per step ([B, T, H] float32) instead of dnum (the core's backward forms dnum where it reads dout). QR (with INV_D):
    q entered before its L2 norm, rq = ±1 / |q| per step: also wq = |rq| / d and eq = |rq| dden, and with QR = 2
    edv = a a_scale / |rq| (the weights of the passes where q's rows serve as keys or values)."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, cs, bos, ce = chunk_bounds(i_c, i_b, cu, chunk_seq, chunk_start, T, C, VARLEN)
    cols = tl.arange(0, BV)
    mc = cols < V
    ob = o + i_b.to(tl.int64) * so_b + i_h * so_h
    db = den + i_b.to(tl.int64) * sd_b + i_h * sd_h
    vb = v + i_b.to(tl.int64) * sv_b + i_h * sv_h
    base = (i_b.to(tl.int64) * T * H + i_h) * V  # dout, do, dv: contiguous [B, T, H, V]
    g = (i_b * n + i_c).to(tl.int64) * H + i_h
    av = 0.0
    c0v = 0.0
    if HAS_A:
        av = _coef(a, i_h, a_val, A_TENSOR)
        if HAS_C0:
            c0v = tl.load(c0 + seq * H + i_h)
        z = tl.load(carry_f + g * V + cols, mask=mc, other=0.0)
        if HAS_DV:
            rb = tl.load(carry_b + g * V + cols, mask=mc, other=0.0)
            pre = tl.zeros([BV], dtype=tl.float32)  # Σ dnum over the chunk's earlier rows
        da_acc = tl.zeros([BR], dtype=tl.float32)
    dd_acc = tl.zeros([BR], dtype=tl.float32)
    if SUMS:
        dsum = tl.zeros([BV], dtype=tl.float32)
    if QR == 2:
        ah = _coef(a, i_h, a_val, A_TENSOR) * a_scale
    for r in range(0, C, BR):
        rows = cs + r + tl.arange(0, BR)
        m = rows < ce
        mk = m[:, None] & mc[None, :]
        r64 = rows.to(tl.int64)[:, None]
        gt = tl.load(dout + base + r64 * (H * V) + cols[None, :], mask=mk, other=0.0).to(tl.float32)
        num = tl.load(ob + r64 * so_t + cols[None, :] * so_v, mask=mk, other=0.0).to(tl.float32)
        if HAS_A:
            x = tl.load(vb + r64 * sv_t + cols[None, :] * sv_v, mask=mk, other=0.0).to(tl.float32)
            zt = tl.cumsum(x, 0) + z[None, :]
            z += tl.sum(x, 0)
            if not OUT_GIVEN:
                num += av * zt
        dn, d, ok = _denominator(db, sd_t, rows, m, bos, c0v, av, eps, HAS_A and not OUT_GIVEN)
        dnum = tl.where(m[:, None], gt / d[:, None], 0.0)
        if OUT_GIVEN:
            ddn = -tl.sum(dnum * num, 1)
        else:
            ddn = -tl.sum(dnum * (num / d[:, None]), 1)
        if SUMS:
            dsum += tl.sum(dnum, 0)
        ddn = tl.where(m & ok, ddn, 0.0)
        step = (i_b.to(tl.int64) * T + rows) * H + i_h  # the rows in [B, T, H]
        if INV_D:
            tl.store(do + step, 1.0 / d, mask=m)
            if QR > 0:
                ar = tl.abs(tl.load(rq + step, mask=m, other=1.0))
                tl.store(wq + step, ar / d, mask=m)
                tl.store(eq + step, ddn * ar, mask=m)
                if QR == 2:
                    tl.store(edv + step, ah / ar, mask=m)
        else:
            tl.store(do + base + r64 * (H * V) + cols[None, :], dnum.to(do.dtype.element_ty), mask=mk)
        tl.store(dden + step, ddn.to(dden.dtype.element_ty), mask=m)
        dd_acc += ddn
        if HAS_A:
            if HAS_DV:
                cum = tl.cumsum(dnum, 0)
                dvt = rb[None, :] - av * (pre[None, :] + cum - dnum)
                pre += tl.sum(dnum, 0)
                tl.store(dv + base + r64 * (H * V) + cols[None, :], dvt.to(dv.dtype.element_ty), mask=mk)
            da_acc += tl.sum(dnum * zt, 1) + ddn * (c0v + (rows - bos + 1).to(tl.float32))
    tl.store(dden_sum + g, tl.sum(dd_acc, 0))
    if SUMS:
        tl.store(dnum_sums + g * V + cols, dsum, mask=mc)
    if HAS_A:
        tl.store(da_part + g, tl.sum(da_acc, 0))


def _tiles(V, C, tile):
    BV = block(V, 1 << 30)
    return BV, max(1, min(block(C, 1 << 30, lo=1), tile // BV))


def epilogue_forward(o, den, v, a, z0, c0, a_val, eps, layout, has_a):
    """out (v's dtype), the carry-in Z of every chunk and Z_T (None without the a part); the kernels of the module
    docstring's forward. a: [H] float32 or None (then a_val); z0 [N, H, V], c0 [N, H] float32 or None."""
    B, T, H, V = v.shape
    n, C = layout.n, layout.C
    BV, BR = _tiles(V, C, _FWD[0])
    lay = (layout.cu, layout.chunk_seq, layout.chunk_start)
    a_t = a if a is not None else den  # a stand-in pointer where the kernels read none
    c0_t = c0 if c0 is not None else den
    carry = zT = None
    if has_a:
        sums = alloc((B * n, H, V), v.device)
        launch(_chunk_sums_kernel, (n, H, B), v, den, c0_t, a_t, sums, *lay, T, H, V, n, 0.0, eps, *v.stride(),
               *den.stride(), C=C, BR=BR, BV=BV, VARLEN=layout.varlen, DIVIDE=False, A_TENSOR=False,
               HAS_C0=False, num_warps=_FWD[1])
        carry, zT = _scan(sums, z0, None, 1.0, layout, H, V, reverse=False, scale=False)
    out = alloc((B, T, H, V), v.device, v.dtype)
    launch(_forward_kernel, (n, H, B), o, den, v, carry if has_a else den, c0_t, a_t, out, *lay, T, H, V, n,
           float(a_val), float(eps), *o.stride(), *den.stride(), *v.stride(), C=C, BR=BR, BV=BV,
           VARLEN=layout.varlen, HAS_A=has_a, A_TENSOR=a is not None, HAS_C0=c0 is not None,
           num_warps=_FWD[1])
    return out, carry, zT


def backward_from_output(dout, dzT, out, den, v, a, c0, carry_f, layout, a_val, eps, need_da, q_norm=None):
    """The backward of out = num / clamp_sign(den, eps) where the core divided (den: the whole denominator):
    (1 / d [B, T, H] float32 (dnum = dout / d), dden, borders, da or None, dz0, dc0 or None, q's weights or None) at
    `layout` (the core's chunks), borders
    = a Σ_{t in later chunks} dnum_t + ∂L/∂Z_T per chunk, [B * chunks, H, V] float32 (the dV pass's rank-one
    state), dz0 its total [N, H, V]. carry_f (z0 + Σ v entering each chunk, from the forward's state call) and v are
    read only for da.
    q_norm = (rq, scale, has_a): q entered before its L2 norm (rq = ±1 / |q| [B, T, H] float32); q's weights are
    (|rq| / d, |rq| dden, a / (scale |rq|) or None without an a part), [B, T, H] float32 (fused_backward's q_raw)."""
    B, T, H, V = v.shape
    n = layout.n
    tile, warps = tuned("division_backward", _BWD)
    BV, BR = _tiles(V, layout.C, tile)
    inv_d = alloc(den.shape, v.device)
    dden = alloc(den.shape, v.device, den.dtype)
    dden_sum = alloc((B * n, H), v.device)
    sums = alloc((B * n, H, V), v.device)
    da_part = alloc((B * n, H), v.device) if need_da else None
    c0_t = c0 if c0 is not None else den
    a_t = a if a is not None else den
    qr, qw, a_scale = 0, (den, den, den, den), 1.0
    if q_norm is not None:
        qr = 2 if q_norm[2] else 1
        qw = (q_norm[0], alloc(den.shape, v.device), alloc(den.shape, v.device),
              alloc(den.shape, v.device) if qr == 2 else den)
        a_scale = 1.0 / q_norm[1]
    launch(_backward_kernel, (n, H, B), out, den, v, dout, carry_f if need_da else den, den, c0_t, a_t, inv_d, dden,
           den, dden_sum, da_part if need_da else den, sums, *qw, layout.cu, layout.chunk_seq, layout.chunk_start, T,
           H, V, n, float(a_val), float(a_scale), float(eps), *out.stride(), *den.stride(), *v.stride(), C=layout.C,
           BR=BR, BV=BV, VARLEN=layout.varlen, HAS_A=need_da, A_TENSOR=a is not None, HAS_C0=c0 is not None,
           HAS_DV=False, OUT_GIVEN=True, SUMS=True, INV_D=True, QR=qr, num_warps=warps)
    carry_b, dz0 = _scan(sums, dzT, a, a_val, layout, H, V, reverse=True, scale=True, exclusive=True)
    dc0 = _dc0(dden_sum, a, a_val, layout, H) if c0 is not None else None
    da = da_part.sum(0) if need_da else None
    weights = None if q_norm is None else (qw[1], qw[2], qw[3] if qr == 2 else None)
    return inv_d, dden, carry_b, da, dz0, dc0, weights


def epilogue_backward(dout, dzT, o, den, v, a, c0, carry_f, layout, a_val, eps, has_a, has_z0):
    """(do, dden, dv or None, da or None, dz0 or None, dc0 or None) of epilogue_forward."""
    B, T, H, V = v.shape
    n = layout.n
    lay = (layout.cu, layout.chunk_seq, layout.chunk_start)
    a_t = a if a is not None else den
    c0_t = c0 if c0 is not None else den
    dout = torch.zeros_like(v) if dout is None else dout.contiguous()
    common = dict(C=layout.C, VARLEN=layout.varlen, A_TENSOR=a is not None, HAS_C0=c0 is not None)
    BV, BR = _tiles(V, layout.C, _FWD[0])
    carry_b = dz0 = None
    if has_a:
        sums = alloc((B * n, H, V), v.device)
        launch(_chunk_sums_kernel, (n, H, B), dout, den, c0_t, a_t, sums, *lay, T, H, V, n, float(a_val),
               float(eps), *dout.stride(), *den.stride(), BR=BR, BV=BV, DIVIDE=True, num_warps=_FWD[1],
               **common)
        carry_b, dz0 = _scan(sums, dzT, a, a_val, layout, H, V, reverse=True, scale=True)
    BV, BR = _tiles(V, layout.C, _BWD[0])
    do = alloc(o.shape, v.device, o.dtype)
    dden = alloc(den.shape, v.device, den.dtype)
    dv = alloc((B, T, H, V), v.device, v.dtype) if has_a else None
    dden_sum = alloc((B * n, H), v.device)
    da_part = alloc((B * n, H), v.device) if has_a else None
    launch(_backward_kernel, (n, H, B), o, den, v, dout, carry_f if has_a else den,
           carry_b if has_a else den, c0_t, a_t, do, dden, dv if has_a else den, dden_sum,
           da_part if has_a else den, den, den, den, den, den, *lay, T, H, V, n, float(a_val), 1.0, float(eps),
           *o.stride(), *den.stride(), *v.stride(), BR=BR, BV=BV, HAS_A=has_a, HAS_DV=has_a, OUT_GIVEN=False,
           SUMS=False, INV_D=False, QR=0,
           num_warps=_BWD[1],
           **common)
    da = da_part.sum(0) if a is not None and has_a else None
    dc0 = _dc0(dden_sum, a, a_val, layout, H) if c0 is not None and has_a else None
    return do, dden, dv, da, (dz0 if has_z0 else None), dc0


def _dc0(dden_sum, a, a_val, layout, H):
    """The gradient of an initial count c0, a Σ dden per sequence [N, H], from the chunks' sums [B * n, H] (a scan,
    no atomics)."""
    total = _scan(dden_sum.view(-1, H, 1), None, a, a_val, layout, H, 1, reverse=False, scale=True)[1]
    return total.view(layout.N, H)


class _EpilogueFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, den, v, a, z0, c0, a_val, eps, cu_seqlens, C, has_a):
        ctx.set_materialize_grads(False)  # an unused Z_T or out: None, no zero tensor
        B, T = v.shape[:2]
        layout = make_layout(B, T, C, cu_seqlens, v.device)
        out, carry, zT = epilogue_forward(o, den, v, a, z0, c0, a_val, eps, layout, has_a)
        ctx.save_for_backward(o, den, v, a, c0, carry)
        ctx.cfg = (layout, a_val, eps, has_a, z0 is not None)
        if zT is not None:
            return out, zT
        return out

    @staticmethod
    @once_differentiable  # kernels' gradients carry no graph: a second derivative raises
    def backward(ctx, dout, dzT=None):
        o, den, v, a, c0, carry_f = ctx.saved_tensors
        layout, a_val, eps, has_a, has_z0 = ctx.cfg
        do, dden, dv, da, dz0, dc0 = epilogue_backward(dout, dzT, o, den, v, a, c0, carry_f, layout, a_val, eps,
                                                       has_a, has_z0)
        da = da if ctx.needs_input_grad[3] else None
        dc0 = dc0 if ctx.needs_input_grad[5] else None
        return do, dden, dv, da, dz0, dc0, None, None, None, None, None


def _scan(x, init, a, a_val, layout, H, V, reverse, scale, exclusive=False):
    """The per-sequence scan of chunk sums x [B*n, H, V] (see _scan_kernel) -> (carry [B*n, H, V], total [N, H, V])."""
    N = layout.N
    carry = alloc(x.shape, x.device)
    total = alloc((N, H, V), x.device)
    BV = block(V, 64)
    init_t = init.contiguous() if init is not None else x
    launch(_scan_kernel, (N, H, cdiv(V, BV)), x, init_t, a if a is not None else x, carry, total,
           layout.chunk_offset, H, V, layout.n, float(a_val), NB=_SCAN_BLOCK, BV=BV, VARLEN=layout.varlen,
           REVERSE=reverse, HAS_INIT=init is not None, A_TENSOR=a is not None, SCALE=scale,
           EXCLUSIVE=exclusive)
    return carry, total


def normalized_epilogue(o, den, v, a, z0, c0, eps, cu_seqlens, final, chunk_size=None):
    """out = (o + a Z) / clamp_sign(den + a C, eps) in v's dtype, and (Z_T [N, H, V], C_T [N, H]) float32 when
    `final` (else None); the module docstring has the math. o [B, T, H, V], den [B, T, H] (any strides);
    a a float or a tensor broadcastable to [H, 1] ([H, 1] or [1]); z0 [N, H, V] and c0 [N, H] or None.
    Gradients reach o, den, v, a, z0, c0."""
    B, T, H, V = v.shape
    a_h, a_val, has_a = coefficient_a(a, H, final)
    z0 = None if z0 is None else z0.to(torch.float32).contiguous()
    c0 = None if c0 is None else c0.to(torch.float32).contiguous()
    C = int(chunk_size or CHUNK)
    res = _EpilogueFn.apply(o, den, v, a_h, z0, c0, a_val, float(eps), cu_seqlens, C, has_a)
    if not final:
        return (res[0] if isinstance(res, tuple) else res), None
    out, zT = res
    return out, (zT, final_count(c0, cu_seqlens, B, T, H, v.device))


def coefficient_a(a, H, final):
    """(a as an [H] float32 tensor or None, a as a number (0.0 beside a tensor), whether the a part runs): it runs
    unless a is the number 0, or always when the final state (whose last row it forms) is asked for."""
    if isinstance(a, torch.Tensor):
        return a.to(torch.float32).reshape(-1).expand(H).contiguous(), 0.0, True  # a 0-d a read by every head
    return None, float(a), final or float(a) != 0.0


def final_count(c0, cu_seqlens, B, T, H, device):
    """C_T [N, H] float32: c0 (or 0) plus each sequence's length."""
    if cu_seqlens is None:
        lens = torch.full((B, 1), float(T), device=device)
    else:
        cu = cu_seqlens.to(device=device)
        lens = (cu[1:] - cu[:-1]).to(torch.float32).unsqueeze(-1)
    return lens.expand(-1, H) if c0 is None else c0 + lens
