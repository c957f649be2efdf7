"""Kernels of the context-parallel entry term (ula/core/cp_entry.py): the state E entering a slice adds

    corr_t = scale · Eᵀ (exp(b_t) ⊙ q_t),    b_t = Σ_{s<=t} g_s  (the left log decay, summed from the slice start)

to the slice's outputs. The PyTorch form materializes exp(b) and its products in float32 over the whole slice
([L, H, K] per sequence: gigabytes at L = 131072 with a vector decay) and its backward several times more; here
b is a chunk-local cumulative sum in registers plus a carry per chunk (a cumulative sum over the chunks' totals,
[.., n_chunks, H, K]), so the slice is read a few times and nothing of its size is written but the results.

Forward (`entry_forward`): out = o + corr, one kernel, parallel over chunks, V blocks and (batch, head).
Backward (`entry_backward`), for dC = d out:
    dq_t = scale · exp(b_t) ⊙ (E dC_t)                       (`_entry_dq_kernel`)
    d b_t = dq_t ⊙ q_t,   dg_s = Σ_{t>=s} d b_t              (the same kernel: a chunk-local reverse cumulative
                                                              sum plus the later chunks' totals, from a first
                                                              run of it that only sums each chunk)
    dE = scale · Σ_t (exp(b_t) ⊙ q_t) dC_tᵀ                  (`_entry_de_kernel`: spans of chunks per program,
                                                              partial sums added over the spans)
Forward direction and left decays only (no decay, constant, scalar, vector); the caller keeps the PyTorch form
for right decays and reverse=True."""
import torch
import triton
import triton.language as tl

from .utils import DOT_F16, DOT_F32, alloc, block, cdiv, dot_code, launch, mm, operand

BT = 64  # steps per chunk


@triton.jit
def _decay_weights(g, carry, rows, mrow, ks, mk, i_b, i_c, i_h, nC, H, sg_b, sg_t, sg_h, sg_k, KG,
                   VEC_G: tl.constexpr):
    """exp(b_t) for the chunk's rows: [BT, BK] (vector decay) or [BT, 1] (one value per step)."""
    if VEC_G:
        gt = tl.load(g + i_b.to(tl.int64) * sg_b + rows.to(tl.int64)[:, None] * sg_t + i_h * sg_h
                     + ks[None, :] * sg_k, mask=mrow[:, None] & mk[None, :], other=0.0).to(tl.float32)
        c0 = tl.load(carry + ((i_b * nC + i_c) * H + i_h) * KG + ks, mask=mk, other=0.0)
        return tl.exp(tl.cumsum(gt, 0) + c0[None, :])
    else:
        gt = tl.load(g + i_b.to(tl.int64) * sg_b + rows.to(tl.int64) * sg_t + i_h * sg_h, mask=mrow,
                     other=0.0).to(tl.float32)
        c0 = tl.load(carry + (i_b * nC + i_c) * H + i_h)
        return tl.exp(tl.cumsum(gt, 0) + c0)[:, None]


@triton.jit
def _decayed_q(q, g, carry, rows, mrow, ks, mk, i_b, i_c, i_h, nC, H, sq_b, sq_t, sq_h, sg_b, sg_t, sg_h, sg_k, KG,
               gb_mult, HAS_G: tl.constexpr, VEC_G: tl.constexpr):
    """The chunk's exp(b_t) ⊙ q_t [BT, BK] (q's own dtype without a decay, float32 with one)."""
    qt = tl.load(q + i_b.to(tl.int64) * sq_b + rows.to(tl.int64)[:, None] * sq_t + i_h * sq_h + ks[None, :],
                 mask=mrow[:, None] & mk[None, :], other=0.0)
    if HAS_G:
        qt = qt.to(tl.float32) * _decay_weights(g, carry, rows, mrow, ks, mk, i_b * gb_mult, i_c, i_h, nC, H,
                                                sg_b, sg_t, sg_h, sg_k, KG, VEC_G)
    return qt


@triton.jit
def _entry_fwd_kernel(q, g, carry, E, o, out, L, H, K, V, nC, sq_b, sq_t, sq_h, so_b, so_t, so_h,
                      sg_b, sg_t, sg_h, sg_k, KG, gb_mult, scale,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr,
                      VEC_G: tl.constexpr, DOT: tl.constexpr):
    i_c, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    rows = i_c * BT + tl.arange(0, BT)
    mrow = rows < L
    ks = tl.arange(0, BK)
    mk = ks < K
    vs = i_v * BV + tl.arange(0, BV)
    mv = vs < V
    qt = _decayed_q(q, g, carry, rows, mrow, ks, mk, i_b, i_c, i_h, nC, H, sq_b, sq_t, sq_h, sg_b, sg_t, sg_h, sg_k,
                    KG, gb_mult, HAS_G, VEC_G)
    e = tl.load(E + (i_bh.to(tl.int64) * K + ks[:, None]) * V + vs[None, :], mask=mk[:, None] & mv[None, :],
                other=0.0)
    corr = mm(operand(qt, DOT), e, DOT) * scale
    optr = rows.to(tl.int64)[:, None] * so_t + vs[None, :]
    m2 = mrow[:, None] & mv[None, :]
    ot = tl.load(o + i_b.to(tl.int64) * so_b + i_h * so_h + optr, mask=m2, other=0.0).to(tl.float32)
    tl.store(out + ((i_b.to(tl.int64) * L + rows.to(tl.int64)[:, None]) * H + i_h) * V + vs[None, :],
             (ot + corr).to(out.dtype.element_ty), mask=m2)


@triton.jit
def _entry_dq_kernel(q, g, carry, E, dc, dq, db_tot, db_carry, dg, L, H, K, V, nC, sq_b, sq_t, sq_h,
                     sd_b, sd_t, sd_h, sg_b, sg_t, sg_h, sg_k, KG, gb_mult, scale,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr,
                     VEC_G: tl.constexpr, NEED_DG: tl.constexpr, TOTALS_ONLY: tl.constexpr, DOT: tl.constexpr):
    """dq (and dg) of one chunk; TOTALS_ONLY: only each chunk's Σ_t d b_t (the carries of the reverse sum)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    rows = i_c * BT + tl.arange(0, BT)
    mrow = rows < L
    ks = tl.arange(0, BK)
    mk = ks < K
    acc = tl.zeros([BT, BK], dtype=tl.float32)
    for v0 in range(0, V, BV):
        vs = v0 + tl.arange(0, BV)
        mv = vs < V
        d = tl.load(dc + i_b.to(tl.int64) * sd_b + rows.to(tl.int64)[:, None] * sd_t + i_h * sd_h + vs[None, :],
                    mask=mrow[:, None] & mv[None, :], other=0.0)
        et = tl.load(E + (i_bh.to(tl.int64) * K + ks[None, :]) * V + vs[:, None], mask=mv[:, None] & mk[None, :],
                     other=0.0)  # Eᵀ [BV, BK]
        acc += mm(operand(d, DOT), et, DOT)
    acc = acc * scale
    if HAS_G:
        acc = acc * _decay_weights(g, carry, rows, mrow, ks, mk, i_b * gb_mult, i_c, i_h, nC, H, sg_b, sg_t, sg_h,
                                   sg_k, KG, VEC_G)
    m2 = mrow[:, None] & mk[None, :]
    if not TOTALS_ONLY:
        tl.store(dq + ((i_b.to(tl.int64) * L + rows.to(tl.int64)[:, None]) * H + i_h) * K + ks[None, :],
                 acc.to(dq.dtype.element_ty), mask=m2)
    if NEED_DG:
        qt = tl.load(q + i_b.to(tl.int64) * sq_b + rows.to(tl.int64)[:, None] * sq_t + i_h * sq_h + ks[None, :],
                     mask=m2, other=0.0).to(tl.float32)
        db = acc * qt
        if VEC_G:
            cidx = ((i_b * nC + i_c) * H + i_h) * KG + ks
            if TOTALS_ONLY:
                tl.store(db_tot + cidx, tl.sum(db, 0), mask=mk)
            else:
                r = tl.cumsum(db, 0, reverse=True) + tl.load(db_carry + cidx, mask=mk, other=0.0)[None, :]
                tl.store(dg + ((i_b.to(tl.int64) * L + rows.to(tl.int64)[:, None]) * H + i_h) * KG + ks[None, :],
                         r, mask=m2)
        else:
            db1 = tl.sum(db, 1)
            cidx = (i_b * nC + i_c) * H + i_h
            if TOTALS_ONLY:
                tl.store(db_tot + cidx, tl.sum(db1, 0))
            else:
                r = tl.cumsum(db1, 0, reverse=True) + tl.load(db_carry + cidx)
                tl.store(dg + (i_b.to(tl.int64) * L + rows.to(tl.int64)) * H + i_h, r, mask=mrow)


@triton.jit
def _entry_de_kernel(q, g, carry, dc, part, L, H, K, V, nC, span, sq_b, sq_t, sq_h, sd_b, sd_t, sd_h,
                     sg_b, sg_t, sg_h, sg_k, KG, gb_mult,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr,
                     VEC_G: tl.constexpr, DOT: tl.constexpr):
    """Σ over a span of chunks of (exp(b) ⊙ q)ᵀ dC, one [BK, BV] block: part [n_spans, B, H, K, V]."""
    i_s, i_kv, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    nV = tl.cdiv(V, BV)
    ks = (i_kv // nV) * BK + tl.arange(0, BK)
    vs = (i_kv % nV) * BV + tl.arange(0, BV)
    mk, mv = ks < K, vs < V
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    for i_c in range(i_s * span, tl.minimum(i_s * span + span, nC)):
        rows = i_c * BT + tl.arange(0, BT)
        mrow = rows < L
        qt = _decayed_q(q, g, carry, rows, mrow, ks, mk, i_b, i_c, i_h, nC, H, sq_b, sq_t, sq_h, sg_b, sg_t, sg_h,
                        sg_k, KG, gb_mult, HAS_G, VEC_G)
        d = tl.load(dc + i_b.to(tl.int64) * sd_b + rows.to(tl.int64)[:, None] * sd_t + i_h * sd_h + vs[None, :],
                    mask=mrow[:, None] & mv[None, :], other=0.0)
        acc += mm(tl.trans(operand(qt, DOT)), operand(d, DOT), DOT)
    B = tl.num_programs(2) // H
    tl.store(part + (((i_s * B + i_b).to(tl.int64) * H + i_h) * K + ks[:, None]) * V + vs[None, :], acc,
             mask=mk[:, None] & mv[None, :])


def _decay_args(g, q):
    """(g or a dummy, its strides, KG, batch multiplier, HAS_G, VEC_G) for g broadcastable to [B, L, H, K|1]."""
    if g is None:
        return q, (0, 0, 0, 0), 1, 0, False, False
    sb, st, sh, sk = g.stride()
    KG = g.shape[-1]
    return g, (sb if g.shape[0] > 1 else 0, st, sh, sk if KG > 1 else 0), KG, int(g.shape[0] > 1), True, KG > 1


def _dot(*tensors):
    """The matmul operands' type: half precision for bfloat16 inputs, float32 otherwise; not float16, whose range a
    state can exceed (E enters the matmuls)."""
    code = dot_code(*tensors)
    return DOT_F32 if code == DOT_F16 else code


def chunk_carry(g, L):
    """The exclusive cumulative sum over chunks of BT steps of g's chunk totals, float32 [Bg, n_chunks, H, KG]."""
    Bg, _, H, KG = g.shape
    nC, full = cdiv(L, BT), L // BT
    tot = torch.zeros(Bg, nC, H, KG, dtype=torch.float32, device=g.device)
    if full:
        tot[:, :full] = g[:, :full * BT].reshape(Bg, full, BT, H, KG).sum(2, dtype=torch.float32)
    if full < nC:
        tot[:, full] = g[:, full * BT:].sum(1, dtype=torch.float32)
    return tot.cumsum(1) - tot


def entry_forward(q, g, E, o, scale, carry):
    """o + scale · Eᵀ(exp(b) ⊙ q) for q [B, L, H, K], g broadcastable to [B, L, H, K|1] or None, E [B, H, K, V]
    (contiguous), o [B, L, H, V] (any strides with a unit last one): a new contiguous tensor in o's dtype."""
    B, L, H, K = q.shape
    assert K <= 256, "the entry kernels hold all of K in one tile (cp_entry.add_entry_term routes K > 256 away)"
    V = E.shape[-1]
    out = alloc((B, L, H, V), q.device, o.dtype)
    g_, sg, KG, gbm, has_g, vec = _decay_args(g, q)
    BK, BV = block(K, 256), block(V, 64)
    nC = cdiv(L, BT)
    launch(_entry_fwd_kernel, (nC, cdiv(V, BV), B * H), q, g_, carry if has_g else q, E, o, out, L, H, K, V, nC,
           q.stride(0), q.stride(1), q.stride(2), o.stride(0), o.stride(1), o.stride(2), *sg, KG, gbm, scale,
           BT=BT, BK=BK, BV=BV, HAS_G=has_g, VEC_G=vec, DOT=_dot(q, o))
    return out


def entry_backward(q, g, E, dc, scale, carry, need_q, need_g, need_e):
    """(dq, dg [B|Bg-summed.., L, H, KG] float32 or None, dE float32) of `entry_forward` for dC = dc."""
    B, L, H, K = q.shape
    V = E.shape[-1]
    g_, sg, KG, gbm, has_g, vec = _decay_args(g, q)
    need_g = need_g and has_g
    BK, BV = block(K, 256), block(V, 64)
    nC = cdiv(L, BT)
    dot = _dot(q, dc)
    common = (L, H, K, V, nC, q.stride(0), q.stride(1), q.stride(2), dc.stride(0), dc.stride(1), dc.stride(2), *sg,
              KG, gbm, scale)
    meta = dict(BT=BT, BK=BK, BV=BV, HAS_G=has_g, VEC_G=vec, NEED_DG=need_g, DOT=dot)
    cr = carry if has_g else q
    dq = dg = dE = None
    if need_q or need_g:
        dq = alloc((B, L, H, K), q.device, q.dtype) if need_q else q
        db_carry = dg_out = q
        if need_g:
            tot = alloc((B, nC, H, KG), q.device)
            launch(_entry_dq_kernel, (nC, B * H), q, g_, cr, E, dc, q, tot, q, q, *common, TOTALS_ONLY=True, **meta)
            db_carry = tot.sum(1, keepdim=True) - tot.cumsum(1)  # Σ over the later chunks
            dg_out = alloc((B, L, H, KG), q.device)
        launch(_entry_dq_kernel, (nC, B * H), q, g_, cr, E, dc, dq, q, db_carry, dg_out, *common,
               TOTALS_ONLY=False, **meta)
        dq = dq if need_q else None
        dg = dg_out if need_g else None
    if need_e:
        BKe, BVe = block(K, 64), block(V, 64)
        n_kv = cdiv(K, BKe) * cdiv(V, BVe)
        # ~4096 programs: a program's loop over its chunks is serial; the partial sums cost n_spans·B·H·K·V floats
        n_spans = max(1, min(nC, cdiv(4096, n_kv * B * H)))
        span = cdiv(nC, n_spans)
        n_spans = cdiv(nC, span)
        part = alloc((n_spans, B, H, K, V), q.device)
        launch(_entry_de_kernel, (n_spans, n_kv, B * H), q, g_, cr, dc, part, L, H, K, V, nC, span,
               q.stride(0), q.stride(1), q.stride(2), dc.stride(0), dc.stride(1), dc.stride(2), *sg, KG, gbm,
               BT=BT, BK=BKe, BV=BVe, HAS_G=has_g, VEC_G=vec, DOT=dot)
        dE = part.sum(0) * scale
    return dq, dg, dE
