"""Kernels of the context-parallel entry term (ula/core/cp_entry.py): the state E entering a slice adds

    corr_t = scale · Eᵀ (exp(b_t) ⊙ q_t),    b_t = Σ_{s<=t} g_s  (the left log decay, summed from the slice start)

to the slice's outputs. The PyTorch form materializes exp(b) and its products in float32 over the whole slice
([L, H, K] per sequence: gigabytes at L = 131072 with a vector decay) and its backward several times more; here
b is a chunk-local cumulative sum in registers plus a carry per chunk (a cumulative sum over the chunks' totals,
[.., n_chunks, H, K]), so the slice is read a few times and nothing of its size is written but the results.

Forward (`entry_forward`): out = o + corr, one kernel, parallel over spans of chunks, V blocks and (batch, head).
Backward (`entry_backward`), for dC = d out:
    dE = scale · Σ_t (exp(b_t) ⊙ q_t) dC_tᵀ                  (`_entry_de_kernel`: spans of chunks per program,
                                                              partial sums added over the spans; with dg wanted
                                                              it also sums each chunk's d b, below, from its
                                                              own share of dE)
    dq_t = scale · exp(b_t) ⊙ (E dC_t)                       (`_entry_dq_kernel`)
    d b_t = dq_t ⊙ q_t,   dg_s = Σ_{t>=s} d b_t              (the same kernel: a chunk-local reverse cumulative
                                                              sum plus the later chunks' totals)
Context parallelism's eager runs ask for dE alone (the core's backward forms the rest, context_parallel.py).
Forward direction and left decays only (no decay, constant, scalar, vector); the caller keeps the PyTorch form
for right decays and reverse=True. A column beside E (mLSTMexp's normalizer n of the state [C | n]) is formed by the
same launches from the same tiles of q, with float32's precision (`_column_operand`)."""
import os

import torch
import triton
import triton.language as tl

from ..time_scan import scan_time
from .utils import DOT_BF16, DOT_F16, DOT_F32, alloc, block, cdiv, dot_code, launch, mm, operand, round_bf16

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
def _column_operand(x, DOT: tl.constexpr):
    """x [N] float32 as an [N, 16] matmul operand (16: tl.dot's least width) whose row sums are x, so that a
    column beside E takes the tensor cores with float32's precision: for bfloat16 operands x in three bfloat16
    parts (hi + mid + lo, ~24 bits; their products with q, itself bfloat16, are exact, and the matmul sums in
    float32), for float32 ones x in the first column alone."""
    js = tl.arange(0, 16)[None, :]
    if DOT == 2 or DOT == 3:
        hi = round_bf16(x)
        mid = round_bf16(x - hi)
        lo = round_bf16(x - hi - mid)
        return tl.where(js == 0, hi[:, None], tl.where(js == 1, mid[:, None], tl.where(js == 2, lo[:, None], 0.0)))
    else:
        return tl.where(js == 0, x[:, None], 0.0)


@triton.jit
def _decayed_q(q, g, carry, rows, mrow, ks, mk, i_b, i_c, i_h, nC, H, sq_b, sq_t, sq_h, sg_b, sg_t, sg_h, sg_k, KG,
               gb_mult, VEC_G: tl.constexpr):
    """The chunk's q_t [BT, BK]: exp(b_t) ⊙ q_t in float32 with a log decay per feature (VEC_G), else as loaded
    (a decay per step is a row scale, which the kernels apply to the matmul's other side or its result)."""
    qt = tl.load(q + i_b.to(tl.int64) * sq_b + rows.to(tl.int64)[:, None] * sq_t + i_h * sq_h + ks[None, :],
                 mask=mrow[:, None] & mk[None, :], other=0.0)
    if VEC_G:
        qt = qt.to(tl.float32) * _decay_weights(g, carry, rows, mrow, ks, mk, i_b * gb_mult, i_c, i_h, nC, H,
                                                sg_b, sg_t, sg_h, sg_k, KG, True)
    return qt


@triton.jit
def _entry_fwd_kernel(q, g, carry, E, o, out, En, n_in, n_out, L, H, K, V, nC, span, sq_b, sq_t, sq_h, so_b, so_t,
                      so_h, su_b, su_t, su_h, sn_b, sn_t, sn_h, sm_b, sm_t, sm_h, sg_b, sg_t, sg_h, sg_k, KG, gb_mult,
                      scale, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, VEC_G: tl.constexpr,
                      ROWS: tl.constexpr, COL: tl.constexpr, DOT: tl.constexpr):
    """out = o + corr over a span of chunks, one V block; the block of E is loaded once for the span. COL: also
    n_out = n_in + scale · En ᵀ(exp(b) ⊙ q) for a column En [K] beside E (mLSTMexp's normalizer) with float32's
    precision (`_column_operand`) by the first V block's programs, from the same tile of q (no decay per feature).
    VEC_G: a log decay per feature, in q's tile; ROWS: one per step, a row scale after the matmul (q stays in its
    own dtype: fewer registers, and no rounding of exp(b) ⊙ q to the operands' precision)."""
    i_s, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    ks = tl.arange(0, BK)
    mk = ks < K
    vs = i_v * BV + tl.arange(0, BV)
    mv = vs < V
    e = operand(tl.load(E + (i_bh.to(tl.int64) * K + ks[:, None]) * V + vs[None, :],
                        mask=mk[:, None] & mv[None, :], other=0.0), DOT)
    if COL:
        ecol = _column_operand(tl.load(En + i_bh.to(tl.int64) * K + ks, mask=mk, other=0.0).to(tl.float32), DOT)
    for i_c in range(i_s * span, tl.minimum(i_s * span + span, nC)):
        rows = i_c * BT + tl.arange(0, BT)
        mrow = rows < L
        qt = _decayed_q(q, g, carry, rows, mrow, ks, mk, i_b, i_c, i_h, nC, H, sq_b, sq_t, sq_h, sg_b, sg_t, sg_h,
                        sg_k, KG, gb_mult, VEC_G)
        corr = mm(operand(qt, DOT), e, DOT) * scale
        if ROWS:
            w = _decay_weights(g, carry, rows, mrow, ks, mk, i_b * gb_mult, i_c, i_h, nC, H, sg_b, sg_t, sg_h, sg_k,
                               KG, False)  # [BT, 1]
            corr = corr * w
        optr = rows.to(tl.int64)[:, None] * so_t + vs[None, :]
        m2 = mrow[:, None] & mv[None, :]
        ot = tl.load(o + i_b.to(tl.int64) * so_b + i_h * so_h + optr, mask=m2, other=0.0).to(tl.float32)
        tl.store(out + i_b.to(tl.int64) * su_b + i_h * su_h + rows.to(tl.int64)[:, None] * su_t + vs[None, :],
                 (ot + corr).to(out.dtype.element_ty), mask=m2)
        if COL:  # the first V block's programs
            mn = mrow & (i_v == 0)
            c = tl.sum(mm(operand(qt, DOT), ecol, DOT), 1) * scale
            if ROWS:
                c = c * tl.sum(w, 1)
            nt = tl.load(n_in + i_b.to(tl.int64) * sn_b + rows.to(tl.int64) * sn_t + i_h * sn_h, mask=mn,
                         other=0.0).to(tl.float32)
            tl.store(n_out + i_b.to(tl.int64) * sm_b + rows.to(tl.int64) * sm_t + i_h * sm_h,
                     (nt + c).to(n_out.dtype.element_ty), mask=mn)


@triton.jit
def _entry_dq_kernel(q, g, carry, E, dc, En, dn, dq, db_carry, dg, L, H, K, V, nC, span, sq_b, sq_t, sq_h,
                     sd_b, sd_t, sd_h, sn_b, sn_t, sn_h, sg_b, sg_t, sg_h, sg_k, KG, gb_mult, scale,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr,
                     VEC_G: tl.constexpr, NEED_DG: tl.constexpr, ONE_V: tl.constexpr, COL: tl.constexpr,
                     DOT: tl.constexpr):
    """dq (and dg, from the later chunks' totals of d b in db_carry) over a span of chunks. With all of V in one
    block (ONE_V: BV >= V), Eᵀ is loaded once for the span. COL: the column En's share too, dn ⊗ En in float32."""
    i_s, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    ks = tl.arange(0, BK)
    mk = ks < K
    if COL:
        ecol = tl.load(En + i_bh.to(tl.int64) * K + ks, mask=mk, other=0.0).to(tl.float32)
    if ONE_V:
        vs = tl.arange(0, BV)
        et_all = operand(tl.load(E + (i_bh.to(tl.int64) * K + ks[None, :]) * V + vs[:, None],
                                 mask=(vs < V)[:, None] & mk[None, :], other=0.0), DOT)  # Eᵀ [BV, BK]
    for i_c in range(i_s * span, tl.minimum(i_s * span + span, nC)):
        rows = i_c * BT + tl.arange(0, BT)
        mrow = rows < L
        acc = tl.zeros([BT, BK], dtype=tl.float32)
        for v0 in range(0, V, BV):
            vs = v0 + tl.arange(0, BV)
            mv = vs < V
            d = tl.load(dc + i_b.to(tl.int64) * sd_b + rows.to(tl.int64)[:, None] * sd_t + i_h * sd_h
                        + vs[None, :], mask=mrow[:, None] & mv[None, :], other=0.0)
            if ONE_V:
                et = et_all
            else:
                et = operand(tl.load(E + (i_bh.to(tl.int64) * K + ks[None, :]) * V + vs[:, None],
                                     mask=mv[:, None] & mk[None, :], other=0.0), DOT)
            acc += mm(operand(d, DOT), et, DOT)
        if COL:
            dcol = tl.load(dn + i_b.to(tl.int64) * sn_b + rows.to(tl.int64) * sn_t + i_h * sn_h, mask=mrow,
                           other=0.0).to(tl.float32)
            acc += dcol[:, None] * ecol[None, :]
        acc = acc * scale
        if HAS_G:
            acc = acc * _decay_weights(g, carry, rows, mrow, ks, mk, i_b * gb_mult, i_c, i_h, nC, H, sg_b, sg_t,
                                       sg_h, sg_k, KG, VEC_G)
        m2 = mrow[:, None] & mk[None, :]
        tl.store(dq + ((i_b.to(tl.int64) * L + rows.to(tl.int64)[:, None]) * H + i_h) * K + ks[None, :],
                 acc.to(dq.dtype.element_ty), mask=m2)
        if NEED_DG:
            qt = tl.load(q + i_b.to(tl.int64) * sq_b + rows.to(tl.int64)[:, None] * sq_t + i_h * sq_h
                         + ks[None, :], mask=m2, other=0.0).to(tl.float32)
            db = acc * qt
            if VEC_G:
                cidx = ((i_b * nC + i_c) * H + i_h) * KG + ks
                r = tl.cumsum(db, 0, reverse=True) + tl.load(db_carry + cidx, mask=mk, other=0.0)[None, :]
                tl.store(dg + ((i_b.to(tl.int64) * L + rows.to(tl.int64)[:, None]) * H + i_h) * KG + ks[None, :],
                         r, mask=m2)
            else:
                r = tl.cumsum(tl.sum(db, 1), 0, reverse=True) + tl.load(db_carry + (i_b * nC + i_c) * H + i_h)
                tl.store(dg + (i_b.to(tl.int64) * L + rows.to(tl.int64)) * H + i_h, r, mask=mrow)


@triton.jit
def _entry_de_kernel(q, g, carry, E, dc, En, dn, part, part_n, tot, L, H, K, V, nC, span, sq_b, sq_t, sq_h,
                     sd_b, sd_t, sd_h, sn_b, sn_t, sn_h, sg_b, sg_t, sg_h, sg_k, KG, gb_mult, scale,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, VEC_G: tl.constexpr,
                     ROWS: tl.constexpr, NEED_TOT: tl.constexpr, COL: tl.constexpr, DOT: tl.constexpr):
    """Σ over a span of chunks of (exp(b) ⊙ q)ᵀ dC, one [BK, BV] block: part [n_spans, B, H, K, V]. COL: the
    first V block's programs also sum (exp(b) ⊙ q)ᵀ dn for the column beside E (float32's precision, from the tile
    of q they hold; no decay per feature): part_n [n_spans, B, H, K]. NEED_TOT: also each chunk's share of Σ_t d b_t,
    scale · Σ_v E ⊙ (its own (exp(b) ⊙ q)ᵀ dC) (plus the column's), per K feature (vector decay: tot [n V blocks, B,
    nC, H, K]) or summed over this block's K features too (tot [n blocks, B, nC, H]): the carries of dg's reverse
    sum, without a pass of their own."""
    i_s, i_kv, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    nV = tl.cdiv(V, BV)
    ks = (i_kv // nV) * BK + tl.arange(0, BK)
    vs = (i_kv % nV) * BV + tl.arange(0, BV)
    mk, mv = ks < K, vs < V
    B = tl.num_programs(2) // H
    first = i_kv % nV == 0  # the column's programs (COL)
    if NEED_TOT:
        e = tl.load(E + (i_bh.to(tl.int64) * K + ks[:, None]) * V + vs[None, :], mask=mk[:, None] & mv[None, :],
                    other=0.0) * scale
        if COL:
            ecol = tl.load(En + i_bh.to(tl.int64) * K + ks, mask=mk, other=0.0).to(tl.float32) * scale
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    acc_n = tl.zeros([BK], dtype=tl.float32)
    for i_c in range(i_s * span, tl.minimum(i_s * span + span, nC)):
        rows = i_c * BT + tl.arange(0, BT)
        mrow = rows < L
        qt = _decayed_q(q, g, carry, rows, mrow, ks, mk, i_b, i_c, i_h, nC, H, sq_b, sq_t, sq_h, sg_b, sg_t, sg_h,
                        sg_k, KG, gb_mult, VEC_G)
        d = tl.load(dc + i_b.to(tl.int64) * sd_b + rows.to(tl.int64)[:, None] * sd_t + i_h * sd_h + vs[None, :],
                    mask=mrow[:, None] & mv[None, :], other=0.0)
        if ROWS:  # one decay per step
            w = _decay_weights(g, carry, rows, mrow, ks, mk, i_b * gb_mult, i_c, i_h, nC, H, sg_b, sg_t, sg_h, sg_k,
                               KG, False)  # [BT, 1]
            # on q's rows (q's tile as loaded for the column's matmul). On dC's rows instead, this matmul faulted in
            # some runs at 4 warps on an H200 (an illegal address, Triton 3.6; bf16, B1 H16 K=V=128, L 4096 and 65536)
            p = mm(tl.trans(operand(qt.to(tl.float32) * w, DOT)), operand(d, DOT), DOT)
        else:
            p = mm(tl.trans(operand(qt, DOT)), operand(d, DOT), DOT)
        acc += p
        if COL:  # zero in the other programs (their loads masked off)
            dcol = tl.load(dn + i_b.to(tl.int64) * sn_b + rows.to(tl.int64) * sn_t + i_h * sn_h, mask=mrow & first,
                           other=0.0).to(tl.float32)
            if ROWS:
                dcol = dcol * tl.sum(w, 1)
            # (dn's parts)ᵀ q: a transposed tile made in registers first, q's as loaded second, the values' matmul's
            # order (the other order is the one that faulted above)
            pn = tl.sum(mm(tl.trans(_column_operand(dcol, DOT)), operand(qt, DOT), DOT), 0)
            acc_n += pn
        if NEED_TOT:
            t = tl.sum(p * e, 1)
            if COL:
                t += pn * ecol
            if VEC_G:
                tl.store(tot + ((((i_kv % nV) * B + i_b).to(tl.int64) * nC + i_c) * H + i_h) * K + ks, t, mask=mk)
            else:
                tl.store(tot + ((i_kv * B + i_b).to(tl.int64) * nC + i_c) * H + i_h, tl.sum(t, 0))
    tl.store(part + (((i_s * B + i_b).to(tl.int64) * H + i_h) * K + ks[:, None]) * V + vs[None, :], acc,
             mask=mk[:, None] & mv[None, :])
    if COL:
        tl.store(part_n + ((i_s * B + i_b).to(tl.int64) * H + i_h) * K + ks, acc_n, mask=mk & first)


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


# chunks per program and warps of the forward (0), dq (1) and dE (2) kernels; ULA_ENTRY_TUNE="span,warps_fwd,warps_dq
# [,warps_de]" for a sweep on the GPU (benchmarks/gpu_cp_profile.py --phases, benchmarks/gpu_entry_term_micro.py)
_TUNE_GIVEN = "ULA_ENTRY_TUNE" in os.environ
_TUNE = [int(x) for x in os.environ.get("ULA_ENTRY_TUNE", "4,8,8").split(",")]
_DE_WARPS = _TUNE[3] if len(_TUNE) > 3 else 4
# Without a decay per feature both kernels take 4 warps: H200, one rank's slice B1 L65536 H16 K128, scalar decay
# (session 43, results/entry_micro_h200_session43_col.log): values forward 0.62 -> 0.43 ms, forward+backward 2.16 ->
# 1.64; mLSTMexp's normalizer column 0.52 -> 0.28 and 1.32 -> 1.13 (no decay and a constant one: the same rule,
# not measured). With a decay per feature (GLA) the forward keeps 8 (session 28).
_WARPS_NO_VEC = 4
# V tiles of the forward and (with decays per feature) of the dE kernel: 128, not 64, so that a program forms a chunk's
# decayed q once for all of V; the forward at 8 warps (4 before). H200, B1 T32768 H16 K=V=128 vector decay, the
# segments of ula/core/time_split.py: forward 0.305 -> 0.224 ms, dE 0.208 -> 0.145; without a decay the forward is
# unchanged and dE slower at 128 (0.059 -> 0.073 ms). Session 28's sweep, benchmarks/RESULTS.md.
_FWD_BV, _DE_BV_VEC = 128, 128


_MIN_PROGRAMS = 2048


def _spans(nC, programs_per_span, which, vec):
    """(chunks per program, programs along the chunks, warps): a program loops over `span` chunks, so E is read
    once per span, while the grid keeps >= ~_MIN_PROGRAMS programs. vec: a decay per feature."""
    span = max(1, min(_TUNE[0], (nC * programs_per_span) // _MIN_PROGRAMS))
    return span, cdiv(nC, span), (_TUNE[1 + which] if vec or _TUNE_GIVEN else _WARPS_NO_VEC)


def _state_operand(E, dot):
    """E as the matmuls read it: bfloat16 where they take bfloat16 operands (rounded once here, not in every
    program, and half the bytes read), else as it is."""
    return E.to(torch.bfloat16) if dot == DOT_BF16 else E


def chunk_carry(g, L, with_total=False):
    """The exclusive cumulative sum over chunks of BT steps of g's chunk totals, float32 [Bg, n_chunks, H, KG]; with
    `with_total` also the sum over all L steps, [Bg, H, KG]."""
    Bg, _, H, KG = g.shape
    nC, full = cdiv(L, BT), L // BT
    tot = torch.zeros(Bg, nC, H, KG, dtype=torch.float32, device=g.device)
    if full:
        tot[:, :full] = g[:, :full * BT].reshape(Bg, full, BT, H, KG).sum(2, dtype=torch.float32)
    if full < nC:
        tot[:, full] = g[:, full * BT:].sum(1, dtype=torch.float32)
    # along the chunks as the last dim (time_scan: PyTorch's scan along an outer dim runs one thread per column,
    # ~0.35 ms for n = 2048 and 16 columns on an H200, session 8's profile); contiguous for the kernels and the total
    inclusive = scan_time(tot, lambda y: y.cumsum(-1)).contiguous()
    # exclusive as the inclusive sum shifted by one chunk, not inclusive - tot: huge finite log decays (-3e38) sum
    # to -inf, and -inf - (-inf) is NaN
    exclusive = torch.cat([torch.zeros_like(inclusive[:, :1]), inclusive[:, :-1]], 1)
    return (exclusive, inclusive[:, -1]) if with_total else exclusive


def _column_args(column, q, vec, n_rows):
    """(En, then the column's n_rows tensors [B, L, H], and those tensors' strides) of a column beside E, or dummies
    (q, zero strides) without one."""
    if column is None:
        return (q,) * (1 + n_rows), (0,) * (3 * n_rows)
    assert not vec, "a column beside E takes q as loaded: no decay per feature (cp_entry routes it)"
    En, *rows = column
    assert En.is_contiguous() and En.dtype == torch.float32 and len(rows) == n_rows
    assert all(tuple(r.shape[1:]) == tuple(q.shape[1:3]) for r in rows)
    return tuple(column), tuple(st for r in rows for st in r.stride())


def entry_forward(q, g, E, o, scale, carry, out=None, dot=None, column=None):
    """o + scale · Eᵀ(exp(b) ⊙ q) for q [B, L, H, K], g broadcastable to [B, L, H, K|1] or None, E [B, H, K, V]
    (contiguous), o [B, L, H, V] (any strides with a unit last one): a new contiguous tensor in o's dtype, or
    written into `out` (o itself for an update in place; any strides with a unit last one). dot: the matmuls'
    operand code (None: by the inputs). column: (En [B, H, K] float32 contiguous, n_in, n_out [B, L, H]) for a
    column beside E (mLSTMexp's normalizer): n_out = n_in + its term, in float32 from the same reads of q."""
    B, L, H, K = q.shape
    assert K <= 256, "the entry kernels hold all of K in one tile (cp_entry.add_entry_term routes K > 256 away)"
    V = E.shape[-1]
    if out is None:
        out = alloc((B, L, H, V), q.device, o.dtype)
    g_, sg, KG, gbm, has_g, vec = _decay_args(g, q)
    BK, BV = block(K, 256), block(V, _FWD_BV)
    nC = cdiv(L, BT)
    dot = _dot(q, o) if dot is None else dot
    span, n_spans, warps = _spans(nC, cdiv(V, BV) * B * H, 0, vec)
    (En, n_in, n_out), sn = _column_args(column, q, vec, 2)
    launch(_entry_fwd_kernel, (n_spans, cdiv(V, BV), B * H), q, g_, carry if has_g else q, _state_operand(E, dot),
           o, out, En, n_in, n_out, L, H, K, V, nC, span, q.stride(0), q.stride(1), q.stride(2), o.stride(0),
           o.stride(1), o.stride(2), out.stride(0), out.stride(1), out.stride(2), *sn, *sg, KG, gbm, scale, BT=BT,
           BK=BK, BV=BV, VEC_G=vec, ROWS=has_g and not vec, COL=column is not None, DOT=dot, num_warps=warps)
    return out


def entry_backward_e(q, g, E, dc, scale, carry, need_e, need_g, dot=None, column=None):
    """(dE float32 or None, the carries of dg's reverse sum or None, the column's dEn [B, H, K] float32 or None):
    the dE kernel, which also forms each chunk's total of d b when dg is wanted. column: (En, dn [B, L, H])."""
    B, L, H, K = q.shape
    V = E.shape[-1]
    g_, sg, KG, gbm, has_g, vec = _decay_args(g, q)
    need_g = need_g and has_g
    if not (need_e or need_g):
        return None, None, None
    nC = cdiv(L, BT)
    BK, BV = block(K, 64), block(V, _DE_BV_VEC if vec else 64)
    nK, nV = cdiv(K, BK), cdiv(V, BV)
    # ~4096 programs: a program's loop over its chunks is serial; the partial sums cost n_spans·B·H·K·V floats
    n_spans = max(1, min(nC, cdiv(4096, nK * nV * B * H)))
    span = cdiv(nC, n_spans)
    n_spans = cdiv(nC, span)
    part = alloc((n_spans, B, H, K, V), q.device)
    part_n = alloc((n_spans, B, H, K), q.device) if column is not None else q
    tot = alloc((nV, B, nC, H, K) if vec else (nK * nV, B, nC, H, 1), q.device) if need_g else q
    (En, dn), sn = _column_args(column, q, vec, 1)
    launch(_entry_de_kernel, (n_spans, nK * nV, B * H), q, g_, carry if has_g else q, E, dc, En, dn, part, part_n,
           tot, L, H, K, V, nC, span, q.stride(0), q.stride(1), q.stride(2), dc.stride(0), dc.stride(1),
           dc.stride(2), *sn, *sg, KG, gbm, scale, BT=BT, BK=BK, BV=BV, VEC_G=vec, ROWS=has_g and not vec,
           NEED_TOT=need_g, COL=column is not None, DOT=_dot(q, dc) if dot is None else dot, num_warps=_DE_WARPS)
    dE = part.sum(0) * scale if need_e else None
    dEn = part_n.sum(0) * scale if need_e and column is not None else None
    db_carry = None
    if need_g:
        tot = tot.sum(0)
        # Σ from each chunk on, then shifted: Σ over the later chunks (contiguous: torch.cat keeps its inputs' strides,
        # and the kernel reads the carries as a contiguous [B, nC, H, KG])
        later = scan_time(tot.flip(1), lambda y: y.cumsum(-1)).contiguous().flip(1)
        db_carry = torch.cat([later[:, 1:], torch.zeros_like(later[:, :1])], 1)
    return dE, db_carry, dEn


def entry_backward_q(q, g, E, dc, scale, carry, db_carry, dot=None, column=None):
    """(dq, dg [B, L, H, KG] float32 or None) from the carries of `entry_backward_e` (db_carry None: no dg).
    column: (En, dn), as entry_backward_e's."""
    B, L, H, K = q.shape
    V = E.shape[-1]
    g_, sg, KG, gbm, has_g, vec = _decay_args(g, q)
    need_g = db_carry is not None
    dq = alloc((B, L, H, K), q.device, q.dtype)
    dg = alloc((B, L, H, KG), q.device) if need_g else None
    nC = cdiv(L, BT)
    dot = _dot(q, dc) if dot is None else dot
    span, n_spans, warps = _spans(nC, B * H, 1, vec)
    (En, dn), sn = _column_args(column, q, vec, 1)
    launch(_entry_dq_kernel, (n_spans, B * H), q, g_, carry if has_g else q, _state_operand(E, dot), dc, En, dn, dq,
           db_carry if need_g else q, dg if need_g else q, L, H, K, V, nC, span, q.stride(0), q.stride(1),
           q.stride(2), dc.stride(0), dc.stride(1), dc.stride(2), *sn, *sg, KG, gbm, scale, BT=BT,
           BK=block(K, 256), BV=block(V, 128), HAS_G=has_g, VEC_G=vec, NEED_DG=need_g, ONE_V=V <= block(V, 128),
           COL=column is not None, DOT=dot, num_warps=warps)
    return dq, dg


def entry_backward(q, g, E, dc, scale, carry, need_q, need_g, need_e, dot=None, column=None):
    """(dq, dg [B|Bg-summed.., L, H, KG] float32 or None, dE float32, the column's dEn or None) of `entry_forward`
    for dC = dc (and dn, the column's: column = (En, dn)): the dE kernel, then the dq kernel (dot: as
    entry_forward's)."""
    need_g = need_g and g is not None
    dE, db_carry, dEn = entry_backward_e(q, g, E, dc, scale, carry, need_e, need_g, dot, column)
    dq = dg = None
    if need_q or need_g:
        dq, dg = entry_backward_q(q, g, E, dc, scale, carry, db_carry, dot, column)
    return dq if need_q else None, dg, dE, dEn
