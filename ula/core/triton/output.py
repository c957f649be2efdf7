"""Kernel 3: the output (paper 000, Alg. 7), parallel over V tiles, row blocks of every chunk and
batch x heads.

    o_i = scale * [ (q_i e^{b_i}) S_enter e^{c_i} + sum_j (q_i . k_j e^{b_i - b_j}) v_j e^{c_i - c_j} ]

with j before i in the chunk (after i in reverse), b, c the chunk-local cumulative log decays of kernel 1.
The intra-chunk matrix is tiled: a program owns BT rows and loops over key blocks of BT, so any chunk size fits.
Off-diagonal blocks with decays per feature: exp(b_i - b_j) = exp(b_i - b_r) exp(b_r - b_j) with a reference step r
between the rows and all their key blocks (both factors <= 1), so each block is one matmul (paper 002 §4.3, secondary
chunking; BT = 16 rows) and the rows' factor is formed once. With one decay value per step the block's decays are a
[BT, BT] factor after the matmul. Diagonal block: per-element relative decays, masked before exp (no positive
exponent forms); for decays per feature through the same reference step as the key blocks where the block's log
decays span at most OWN_RANGE (one matmul), else secondary chunking down to single steps, in a second launch.

The scale of the part through the states and of the intra-chunk part are separate (the backward's passes enter
with states already scaled), and an optional epilogue forms the log-decay gradient's per-step terms."""
import torch
import triton
import triton.language as tl

from .utils import (DOT_F16, alloc, block, cdiv, chunk_bounds, head_bases, is_tuned, launch, mm, mm_split, operand,
                    own_dot, part_dot, signed_inverse, stages_of, takes_part, tuned, warps_for)

# the largest span of log decays (max - min over a row block, any feature) for which the rows' own block goes
# through one reference step (one matmul) rather than by levels: e^60 ~ 1e26 stays far from float32's and
# bfloat16's limits (3e38), and e^-60 far above their smallest normal numbers. float16 (largest 65504 ~ e^11) takes
# the levels everywhere.
OWN_RANGE = 60.0


@triton.jit
def _source_v(v_base, u_base, r64, m, vc, mv, V, GATE: tl.constexpr, DOT: tl.constexpr):
    """v rows of source steps as a matmul operand, times exp(u) of each step with a source gate (a key gate in
    the passes where k, v are the sources)."""
    vt = operand(tl.load(v_base + r64[:, None] * V + vc[None, :], mask=m[:, None] & mv[None, :], other=0.0), DOT)
    if GATE == 1:
        vt = vt * tl.exp(tl.load(u_base + r64, mask=m, other=0.0).to(tl.float32))[:, None]
    return vt


@triton.jit
def _ones_sum(A, u_base, r64, m, GATE: tl.constexpr):
    """Row sums of A times each source step's gate: A @ (a column of ones in v), the normalizer's share."""
    if GATE == 1:
        return tl.sum(A * tl.exp(tl.load(u_base + r64, mask=m, other=0.0).to(tl.float32))[None, :], 1)
    return tl.sum(A, 1)


@triton.jit
def _rank_one(A, e_base, ri, mi, rj, mj, R1: tl.constexpr):
    """The scores of one more feature, e on one side and 1 on the other (a column of ones in v, and its gradient
    e, in the backward's passes): R1 = 1 adds e_i of the rows, R1 = 2 e_j of the keys."""
    if R1 == 1:
        A += tl.load(e_base + ri, mask=mi, other=0.0).to(tl.float32)[:, None]
    elif R1 == 2:
        A += tl.load(e_base + rj, mask=mj, other=0.0).to(tl.float32)[None, :]
    return A


@triton.jit
def _scores(A, e_base, w_base, ri, mi, rj, mj, R1: tl.constexpr, W: tl.constexpr, rq, QNORM: tl.constexpr):
    """The scores q·k of a block with their rank-one feature (_rank_one) and a weight per step (W = 1: the rows',
    2: the keys' before the rank-one term, 3: the keys' after it); QNORM: the rows times rq [BT] before it (q's rows
    L2-normalized here)."""
    if QNORM:
        A = A * rq[:, None]
    if W == 1:
        A = A * tl.load(w_base + ri, mask=mi, other=0.0)[:, None]
    elif W == 2:
        A = A * tl.load(w_base + rj, mask=mj, other=0.0)[None, :]
    A = _rank_one(A, e_base, ri, mi, rj, mj, R1)
    if W == 3:
        A = A * tl.load(w_base + rj, mask=mj, other=0.0)[None, :]
    return A


@triton.jit
def _offdiag(q_base, k_base, v_base, b_base, u_base, rows, mi, js, ce, vc, mv, K, V, H, DB: tl.constexpr, BT: tl.constexpr,
             BK: tl.constexpr, HAS_B: tl.constexpr, GATE: tl.constexpr, DOT: tl.constexpr, ONES: tl.constexpr, e_base,
             R1: tl.constexpr, w_base, W: tl.constexpr, rq, QNORM: tl.constexpr):
    """Contribution of the key block starting at js (entirely before the rows, after them in reverse), for
    decays with one value per step: the block's decays are one [BT, BT] factor after the matmul. Returns it and
    (with ONES) the block's share of the normalizer."""
    cols = js + tl.arange(0, BT)
    mj = cols < ce
    ri = rows.to(tl.int64) * H
    rj = cols.to(tl.int64) * H
    A = tl.zeros([BT, BT], dtype=tl.float32)
    for kk in range(0, K, BK):
        kc = kk + tl.arange(0, BK)
        mk = kc < K
        qt = operand(tl.load(q_base + ri[:, None] * K + kc[None, :], mask=mi[:, None] & mk[None, :], other=0.0), DOT)
        kt = operand(tl.load(k_base + rj[:, None] * K + kc[None, :], mask=mj[:, None] & mk[None, :], other=0.0), DOT)
        A += mm(qt, tl.trans(kt), DOT)
    A = _scores(A, e_base, w_base, ri, mi, rj, mj, R1, W, rq, QNORM)
    if HAS_B:
        bi = tl.load(b_base + ri * DB, mask=mi, other=0.0)
        bj = tl.load(b_base + rj * DB, mask=mj, other=0.0)
        A = A * tl.exp(tl.where(mi[:, None] & mj[None, :], bi[:, None] - bj[None, :], float("-inf")))
    vt = _source_v(v_base, u_base, rj, mj, vc, mv, V, GATE, DOT)
    ones = 0.0
    if ONES:
        ones = _ones_sum(A, u_base, rj, mj, GATE)
    return mm(A, vt, DOT), ones


@triton.jit
def _offdiag_vec(qs, k_base, v_base, b_base, c_base, u_base, rr, js, ce, vc, mv, K, V, H, DB: tl.constexpr,
                 BT: tl.constexpr, BKF: tl.constexpr, HAS_B: tl.constexpr, HAS_C: tl.constexpr, GATE: tl.constexpr,
                 DOT: tl.constexpr, OWN: tl.constexpr, rows, REVERSE: tl.constexpr, ODOT: tl.constexpr,
                 SPLIT_KEYS: tl.constexpr):
    """Decays per feature: the key block starting at js against the rows' q already decayed to the reference
    step r (qs, all K features; r lies between every key of an off-diagonal block and every row, so one r
    serves all blocks). Returns A @ (v decayed from the keys to r); the caller applies the rows' side of c.
    OWN: the rows' own block (js = the rows' first step), causal; its keys' factors exp(b_r - b_j) exceed 1, so
    the caller takes this path only where the block's decays span a bounded range."""
    cols = js + tl.arange(0, BT)
    mj = cols < ce
    rj = cols.to(tl.int64) * H
    kf = tl.arange(0, BKF)
    mk = kf < K
    kt = tl.load(k_base + rj[:, None] * K + kf[None, :], mask=mj[:, None] & mk[None, :], other=0.0).to(tl.float32)
    if HAS_B:
        if DB > 1:
            br = tl.load(b_base + rr * DB + kf, mask=mk, other=0.0)[None, :]
            bk = tl.load(b_base + rj[:, None] * DB + kf[None, :], mask=mj[:, None] & mk[None, :], other=0.0)
        else:
            br = tl.load(b_base + rr * DB)
            bk = tl.load(b_base + rj * DB, mask=mj, other=0.0)[:, None]
        kt = kt * tl.exp(tl.where(mj[:, None], br - bk, float("-inf")))
    A = mm(qs, tl.trans(kt), ODOT if OWN else DOT)
    if OWN:
        if REVERSE:
            A = tl.where(rows[:, None] <= cols[None, :], A, 0.0)
        else:
            A = tl.where(rows[:, None] >= cols[None, :], A, 0.0)
    vt = _source_v(v_base, u_base, rj, mj, vc, mv, V, GATE, DOT)
    if HAS_C:
        cr = tl.load(c_base + rr * V + vc, mask=mv, other=0.0)
        cj = tl.load(c_base + rj[:, None] * V + vc[None, :], mask=mj[:, None] & mv[None, :], other=0.0)
        vt = vt * tl.exp(tl.where(mj[:, None], cr[None, :] - cj, float("-inf")))
    if OWN:
        return mm(A, vt, ODOT)
    if SPLIT_KEYS:  # precision part split_keys: A kept to ~16 bits as bfloat16 hi + lo
        return mm_split(A, vt, DOT)
    return mm(A, vt, DOT)


@triton.jit
def _diag_vec(q_base, k_base, v_base, b_base, c_base, u_base, rows, mi, ce, vc, mv, K, V, H,
              DB: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LOG_BT: tl.constexpr,
              HAS_B: tl.constexpr, HAS_C: tl.constexpr, REVERSE: tl.constexpr, GATE: tl.constexpr,
              DOT: tl.constexpr):
    """The rows' own block with decays per feature, without per-element [BT, BT, D] work: secondary
    chunking taken down to single steps. At level h the block is cut into pieces of 2h steps; every pair
    (later half, earlier half) of a piece goes through the piece's middle step r, exp(b_i - b_j) =
    exp(b_i - b_r) exp(b_r - b_j) (both <= 1), so each level is one masked matmul. Levels h = BT/2 .. 1
    cover every pair i != j; i = j carries no decay."""
    idx = tl.arange(0, BT)
    ri = rows.to(tl.int64) * H
    vt = _source_v(v_base, u_base, ri, mi, vc, mv, V, GATE, DOT)
    if HAS_C:
        cv = tl.load(c_base + ri[:, None] * V + vc[None, :], mask=mi[:, None] & mv[None, :], other=0.0)
    # i = j
    dd = tl.zeros([BT], dtype=tl.float32)
    for kk in range(0, K, BK):
        kc = kk + tl.arange(0, BK)
        mik = mi[:, None] & (kc < K)[None, :]
        qt = operand(tl.load(q_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0), DOT)
        kt = operand(tl.load(k_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0), DOT)
        dd += tl.sum(qt * kt, 1)
    out = dd[:, None] * vt
    for lvl in tl.static_range(LOG_BT):
        piece = idx // (BT >> lvl)
        later = (idx % (BT >> lvl)) >= (BT >> (lvl + 1))
        if REVERSE:  # queries before keys: query rows in the earlier half, reference = first step of the later
            qsel, ksel = ~later, later
            ref = piece * (BT >> lvl) + (BT >> (lvl + 1))
        else:
            qsel, ksel = later, ~later
            ref = piece * (BT >> lvl) + (BT >> (lvl + 1)) - 1
        ref_rows = rows - idx + ref
        ref_ok = ref_rows < ce
        qsel = qsel & mi & ref_ok
        ksel = ksel & mi & ref_ok
        rr = ref_rows.to(tl.int64) * H
        A = tl.zeros([BT, BT], dtype=tl.float32)
        for kk in range(0, K, BK):
            kc = kk + tl.arange(0, BK)
            mk = (kc < K)[None, :]
            mik = mi[:, None] & mk
            qt = operand(tl.load(q_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0), DOT)
            kt = operand(tl.load(k_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0), DOT)
            if HAS_B:
                if DB > 1:
                    bq = tl.load(b_base + ri[:, None] * DB + kc[None, :], mask=mik, other=0.0)
                    br = tl.load(b_base + rr[:, None] * DB + kc[None, :], mask=ref_ok[:, None] & mk, other=0.0)
                else:  # a scalar left decay beside a right decay: one value per step, broadcast over K
                    bq = tl.load(b_base + ri * DB, mask=mi, other=0.0)[:, None]
                    br = tl.load(b_base + rr * DB, mask=ref_ok, other=0.0)[:, None]
                qt = qt * tl.exp(tl.where(qsel[:, None], bq - br, float("-inf")))
                kt = kt * tl.exp(tl.where(ksel[:, None], br - bq, float("-inf")))
            else:
                qt = tl.where(qsel[:, None], qt, 0.0)
                kt = tl.where(ksel[:, None], kt, 0.0)
            A += mm(qt, tl.trans(kt), DOT)
        A = tl.where((piece[:, None] == piece[None, :]) & qsel[:, None] & ksel[None, :], A, 0.0)
        if HAS_C:
            cr = tl.load(c_base + rr[:, None] * V + vc[None, :], mask=ref_ok[:, None] & mv[None, :], other=0.0)
            vs = vt * tl.exp(tl.where(ksel[:, None], cr - cv, float("-inf")))
            out += tl.exp(tl.where(qsel[:, None], cv - cr, float("-inf"))) * mm(A, vs, DOT)
        else:
            out += mm(A, vt, DOT)
    return out


@triton.jit
def _diag(q_base, k_base, v_base, b_base, u_base, rows, mi, vc, mv, K, V, H, DB: tl.constexpr, BT: tl.constexpr,
          BK: tl.constexpr, HAS_B: tl.constexpr, REVERSE: tl.constexpr, GATE: tl.constexpr, DOT: tl.constexpr,
          ONES: tl.constexpr, e_base, R1: tl.constexpr, w_base, W: tl.constexpr, rq, QNORM: tl.constexpr):
    """Contribution of the rows' own block (keys = the same steps), causal in the direction of the pass,
    for decays without a per-feature part (one value per step); with ONES also its share of the normalizer."""
    ri = rows.to(tl.int64) * H
    if REVERSE:
        m = (rows[:, None] <= rows[None, :]) & mi[:, None] & mi[None, :]
    else:
        m = (rows[:, None] >= rows[None, :]) & mi[:, None] & mi[None, :]
    A = tl.zeros([BT, BT], dtype=tl.float32)
    for kk in range(0, K, BK):
        kc = kk + tl.arange(0, BK)
        mik = mi[:, None] & (kc < K)[None, :]
        qt = operand(tl.load(q_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0), DOT)
        kt = operand(tl.load(k_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0), DOT)
        A += mm(qt, tl.trans(kt), DOT)
    A = _scores(A, e_base, w_base, ri, mi, ri, mi, R1, W, rq, QNORM)
    if HAS_B:
        bi = tl.load(b_base + ri * DB, mask=mi, other=0.0)
        A = A * tl.exp(tl.where(m, bi[:, None] - bi[None, :], float("-inf")))
    else:
        A = tl.where(m, A, 0.0)
    vt = _source_v(v_base, u_base, ri, mi, vc, mv, V, GATE, DOT)
    ones = 0.0
    if ONES:
        ones = _ones_sum(A, u_base, ri, mi, GATE)
    return mm(A, vt, DOT), ones


@triton.jit
def _own_span(b_base, c_base, rs, ce, live, BT: tl.constexpr, vc, mv, K, V, H, DB: tl.constexpr,
              BKF: tl.constexpr, HAS_B: tl.constexpr, HAS_C: tl.constexpr):
    """The span of the rows' cumulative log decays, the largest over the features (of this V tile for c): how far
    from 1 the factors of the rows' own block through one reference step can be. Log decays are <= 0, so a
    chunk-local cumulative sum is monotone and the span is the difference of the block's first and last rows
    (two rows read, not the block)."""
    r_first = rs.to(tl.int64) * H
    r_last = (tl.minimum(rs + BT, ce) - 1).to(tl.int64) * H
    span = 0.0
    if HAS_B:
        if DB > 1:
            kf = tl.arange(0, BKF)
            mk = (kf < K) & live
            span = tl.max(tl.abs(tl.load(b_base + r_last * DB + kf, mask=mk, other=0.0) -
                                 tl.load(b_base + r_first * DB + kf, mask=mk, other=0.0)), 0)
        else:
            span = tl.abs(tl.load(b_base + r_last * DB, mask=live, other=0.0) -
                          tl.load(b_base + r_first * DB, mask=live, other=0.0))
    if HAS_C:
        mc = mv & live
        span = tl.maximum(span, tl.max(tl.abs(tl.load(c_base + r_last * V + vc, mask=mc, other=0.0) -
                                              tl.load(c_base + r_first * V + vc, mask=mc, other=0.0)), 0))
    return span


@triton.jit
def _output_kernel(q, k, v, b, c, u, border, h0, o, dg_a, dg_out, du_out, n_border, n0, den, e, r1_border, r1_n0, c0,
                   px, pr, w, flags, cu, chunk_seq, chunk_start, T, H, K, V, NC, r1_sh, r1_sc, sb_b, sc_b, s_sk, s_sv,
                   scale_inter,
                   scale_intra, dg_coef, dg_slab, eps,
                   DB: tl.constexpr, C: tl.constexpr, NRB: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, HAS_B: tl.constexpr, HAS_C: tl.constexpr, VEC: tl.constexpr,
                   HAS_H0: tl.constexpr, REVERSE: tl.constexpr, VARLEN: tl.constexpr, DOT: tl.constexpr,
                   LOG_BT: tl.constexpr, DG: tl.constexpr, DG_ACC: tl.constexpr, BKF: tl.constexpr,
                   GATE: tl.constexpr, HAS_DU: tl.constexpr, ONES: tl.constexpr, R1: tl.constexpr, OWN: tl.constexpr,
                   OWN_MAX: tl.constexpr, SDOT: tl.constexpr, ODOT: tl.constexpr,
                   SPLIT_KEYS: tl.constexpr, HAS_C0: tl.constexpr, DIVIDE: tl.constexpr, PROJECT: tl.constexpr,
                   R1_ENTERING: tl.constexpr, W: tl.constexpr, QNORM: tl.constexpr, L2_EPS: tl.constexpr):
    i_r, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # row blocks on axis 0 (up to 2^31)
    i_b, i_h = i_bh // H, i_bh % H
    i_c = i_r // NRB
    sub = i_r % NRB
    seq, cs, bos, ce = chunk_bounds(i_c, i_b, cu, chunk_seq, chunk_start, T, C, VARLEN)
    rs = cs + sub * BT
    live = rs < ce
    rows = rs + tl.arange(0, BT)
    mi = rows < ce
    ri = rows.to(tl.int64) * H
    vc = i_v * BV + tl.arange(0, BV)
    mv = vc < V
    row0, k_base, v_base, b_base, c_base, u_base, e_base = head_bases(k, v, b, c, u, e, i_b, i_h, T, H, K, V, sb_b,
                                                                      sc_b, DB)
    q_base = q + row0 * K
    w_base = w + row0  # [B, T, H] like e
    # decays per feature, two launches (chunk_output): OWN = 1 takes the row blocks whose own block goes through
    # one reference step and flags the others, OWN = 2 takes the flagged ones by levels
    f_off = (i_bh.to(tl.int64) * tl.num_programs(1) + i_v) * tl.num_programs(0) + i_r
    if OWN == 1:
        span = _own_span(b_base, c_base, rs, ce, live, BT, vc, mv, K, V, H, DB, BKF, HAS_B, HAS_C)
        tl.store(flags + f_off, (span > OWN_MAX).to(tl.int8), mask=live)
        live = live & (span <= OWN_MAX)
    elif OWN == 2:
        live = live & (tl.load(flags + f_off) != 0)
    if live:
        if PROJECT:  # the projection's rows loaded before the matmuls: dK pass 0.189 -> 0.178 ms, dQ the same
            # (H100 B2 T8192 H16 K=V=128, results/pending20_h100_session20_part2.log)
            x_pr = tl.load(px + row0 * V + ri[:, None] * V + vc[None, :], mask=mi[:, None] & mv[None, :], other=0.0)
            r_pr = tl.load(pr + row0 + ri, mask=mi, other=0.0)
        # inter-chunk part through the state entering the chunk
        bord = border + ((i_b.to(tl.int64) * H + i_h) * NC) * K * V
        if REVERSE:
            s_ptr = bord + i_c.to(tl.int64) * K * V
        else:
            first = cs == bos
            s_ptr = bord + tl.maximum(i_c - 1, 0).to(tl.int64) * K * V
            from_border = cs != bos
        h_ptr = h0 + (seq.to(tl.int64) * H + i_h) * K * V
        acc = tl.zeros([BT, BV], dtype=tl.float32)
        # ONES (forward, decays with one value per step): the normalizer Σ_j w_ij of a column of ones in v, from
        # the state's extra vector n (inter) and the row sums of the scores (intra), no V + 1 column
        den_inter = tl.zeros([BT], dtype=tl.float32)
        den_intra = tl.zeros([BT], dtype=tl.float32)
        sq = tl.zeros([BT], dtype=tl.float32)  # QNORM: Σ q² of the rows, from the normalizer's second read of q
        nb_ptr = n_border + ((i_b.to(tl.int64) * H + i_h) * NC + tl.maximum(i_c - 1, 0)) * K
        n0_ptr = n0 + (seq.to(tl.int64) * H + i_h) * K
        for kk in range(0, K, BK):
            kc = kk + tl.arange(0, BK)
            mk = kc < K
            mik = mi[:, None] & mk[None, :]
            # SDOT: the matmul code of this part (chunk_output's state_dot), its q tile loaded for it
            qt = operand(tl.load(q_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0), SDOT)
            if HAS_B and DB > 1:
                qt = qt * tl.exp(tl.load(b_base + ri[:, None] * DB + kc[None, :], mask=mik, other=0.0))
            kv_off = kc[:, None] * s_sk + vc[None, :] * s_sv  # (1, K) reads a state stored transposed
            mkv = mk[:, None] & mv[None, :]
            if REVERSE:
                st = tl.load(s_ptr + kv_off, mask=mkv, other=0.0).to(tl.float32)
            elif HAS_H0:  # h0 in the border states' dtype: one load from either (two masked loads and an add
                # in float32 made the dQ pass with an initial state ~2x slower on an H200, session 8)
                st = tl.load(tl.where(first, h_ptr, s_ptr) + kv_off, mask=mkv, other=0.0).to(tl.float32)
            else:
                st = tl.load(s_ptr + kv_off, mask=mkv & from_border, other=0.0).to(tl.float32)
            acc += mm(qt, st, SDOT)
            if ONES:
                nt = tl.load(nb_ptr + kc, mask=mk & from_border, other=0.0).to(tl.float32)
                if HAS_H0:
                    nt += tl.load(n0_ptr + kc, mask=mk & first, other=0.0)
                # q read again for these float32 products: with the matmul's tile feeding them too, Triton's
                # software pipelining gave o that differs from call to call (chunk_output); a volatile load is
                # its own (not merged with the matmul's)
                qf = tl.load(q_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0, volatile=True)
                qf = qf.to(tl.float32)
                den_inter += tl.sum(qf * nt[None, :], 1)
                if QNORM:
                    sq += tl.sum(qf * qf, 1)
        rq = 0.0
        if QNORM:  # q's rows L2-normalized here: every part through q times 1 / max(|q_i|, eps), not the rank-one
            # term (paper 001, Eq. 22); r stored with the clamp's sign (the backward's projection drops a term there)
            nq = tl.sqrt(sq)
            qd = tl.maximum(nq, L2_EPS)
            rq = 1.0 / qd
            acc = acc * rq[:, None]
            den_inter = den_inter * rq
            tl.store(pr + row0 + ri, signed_inverse(nq, qd, L2_EPS), mask=mi & (i_v == 0))
        if W == 1:  # the rows' weights, on their part through the state (the rank-one part below is not weighted)
            acc = acc * tl.load(w_base + ri, mask=mi, other=0.0)[:, None]
        if R1 > 0:  # the extra feature's share through the state: e_i (rows) or 1 times the state's extra vector
            n_head = r1_border + i_b.to(tl.int64) * H * NC * V + i_h * r1_sh  # head i_h's vector per chunk
            if REVERSE or R1_ENTERING:  # the vector entering this chunk (going forward: its initial state in it)
                nt = tl.load(n_head + i_c.to(tl.int64) * r1_sc + vc, mask=mv, other=0.0).to(tl.float32)
            else:
                nt = tl.load(n_head + tl.maximum(i_c - 1, 0).to(tl.int64) * r1_sc + vc, mask=mv & from_border,
                             other=0.0).to(tl.float32)
                if HAS_H0:
                    nt += tl.load(r1_n0 + (seq.to(tl.int64) * H + i_h) * V + vc, mask=mv & first, other=0.0)
            if R1 == 1:
                er = tl.load(e_base + ri, mask=mi, other=0.0).to(tl.float32)
                acc += er[:, None] * nt[None, :]
                if ONES:  # the normalizer's share: e_i times the steps before the chunk (and an initial count c0),
                    # in float64: where the sum nears 0 it cancels, and float32 rounding of e C would stay in it
                    cnt = (cs - bos).to(tl.float64)
                    if HAS_C0:
                        cnt += tl.load(c0 + seq.to(tl.int64) * H + i_h).to(tl.float64)
                    den_cnt = er.to(tl.float64) * cnt
            else:
                acc += nt[None, :]
        if HAS_B and DB == 1:  # one decay per step: after the matmul, so q e^b is not rounded to half precision
            eb = tl.exp(tl.load(b_base + ri * DB, mask=mi, other=0.0))
            acc = acc * eb[:, None]
            den_inter = den_inter * eb
        if HAS_C:
            ci = tl.load(c_base + ri[:, None] * V + vc[None, :], mask=mi[:, None] & mv[None, :], other=0.0)
            acc = acc * (tl.exp(ci) * scale_inter)
        else:
            acc = acc * scale_inter
        # intra-chunk part: the rows' own block, then the key blocks before them (after them in reverse)
        if not VEC:
            part, ones = _diag(q_base, k_base, v_base, b_base, u_base, rows, mi, vc, mv, K, V, H, DB, BT, BK, HAS_B,
                               REVERSE, GATE, DOT, ONES, e_base, R1, w_base, W, rq, QNORM)
            acc += part * scale_intra
            den_intra += ones
        if REVERSE:
            lo, hi = rs + BT, ce
        else:
            lo, hi = cs, rs
        if VEC:
            # one reference step r between the rows and every earlier (later in reverse) key block: the rows'
            # first step (last in reverse), so q is decayed to r once for all blocks and c's row side applied once
            if REVERSE:  # the rows' last step (a chunk's last block may end early: then no key block follows);
                # either way r is one of the rows, so its loads need no mask
                r = tl.minimum(rs + BT, ce) - 1
            else:
                r = rs
            rr = r.to(tl.int64) * H
            kf = tl.arange(0, BKF)
            mqf = mi[:, None] & (kf < K)[None, :]
            qs = tl.load(q_base + ri[:, None] * K + kf[None, :], mask=mqf, other=0.0).to(tl.float32)
            if HAS_B:
                if DB > 1:
                    bq = tl.load(b_base + ri[:, None] * DB + kf[None, :], mask=mqf, other=0.0)
                    br = tl.load(b_base + rr * DB + kf, mask=kf < K, other=0.0)[None, :]
                else:
                    bq = tl.load(b_base + ri * DB, mask=mi, other=0.0)[:, None]
                    br = tl.load(b_base + rr * DB)
                qs = qs * tl.exp(tl.where(mi[:, None], bq - br, float("-inf")))
            off = tl.zeros([BT, BV], dtype=tl.float32)
            # the rows' own block: through the same reference step as the key blocks (one matmul) where its log
            # decays span at most OWN_MAX (OWN_RANGE), so that its keys' factors exp(b_r - b_j) stay below e^60; else
            # by levels (_diag_vec), which forms no factor above 1 (in its own launch: compiled into this one it
            # cost registers and ~15% of every call, B2 T8192 H16 vector decay f+b 3.29 against 2.80 ms)
            if OWN == 1:
                off += _offdiag_vec(qs, k_base, v_base, b_base, c_base, u_base, rr, rs, ce, vc, mv, K, V, H,
                                    DB, BT, BKF, HAS_B, HAS_C, GATE, DOT, True, rows, REVERSE, ODOT, SPLIT_KEYS)
            else:
                acc += _diag_vec(q_base, k_base, v_base, b_base, c_base, u_base, rows, mi, ce, vc, mv, K, V, H, DB,
                                 BT, BK, BV, LOG_BT, HAS_B, HAS_C, REVERSE, GATE, DOT) * scale_intra
            for js in range(lo, hi, BT):
                off += _offdiag_vec(qs, k_base, v_base, b_base, c_base, u_base, rr, js, ce, vc, mv, K, V, H, DB,
                                    BT, BKF, HAS_B, HAS_C, GATE, DOT, False, rows, REVERSE, ODOT, SPLIT_KEYS)
            if HAS_C:  # ci: the rows' c, loaded for the part through the states
                cr = tl.load(c_base + rr * V + vc, mask=mv, other=0.0)
                off = off * tl.exp(tl.where(mi[:, None], ci - cr[None, :], float("-inf")))
            acc += off * scale_intra
        else:
            for js in range(lo, hi, BT):
                part, ones = _offdiag(q_base, k_base, v_base, b_base, u_base, rows, mi, js, ce, vc, mv, K, V, H, DB,
                                      BT, BK, HAS_B, GATE, DOT, ONES, e_base, R1, w_base, W, rq, QNORM)
                acc += part * scale_intra
                den_intra += ones
        if GATE == 2:  # a key gate in the passes whose rows are key steps: the gradient of k e^u is e^u times
            acc = acc * tl.exp(tl.load(u_base + ri, mask=mi, other=0.0).to(tl.float32))[:, None]
        mo = mi[:, None] & mv[None, :]
        o_off = row0 * V + ri[:, None] * V + vc[None, :]
        if ONES:  # every V tile forms it; the first stores it
            den_all = den_inter * scale_inter + den_intra * scale_intra
            if R1 == 1:
                den_all = (den_all.to(tl.float64) + den_cnt * scale_inter).to(tl.float32)
            if DIVIDE:  # o / den, den's magnitude kept at least eps with its sign (0 counts as positive)
                acc = acc / tl.where(den_all >= 0, tl.maximum(den_all, eps), tl.minimum(den_all, -eps))[:, None]
            tl.store(den + row0 + ri, den_all, mask=mi & (i_v == 0))
        if PROJECT:  # the gradient through x = y / |y| (one V tile holds the whole row): (g - x (x·g)) |r|,
            # the second term where r > 0 (|y| above the norm's eps)
            xt = x_pr.to(tl.float32)
            if PROJECT == 2:  # x as given, not normalized: the normalized row is x |r|
                xt = xt * tl.abs(r_pr)[:, None]
            acc = (acc - xt * tl.where(r_pr > 0, tl.sum(xt * acc, 1), 0.0)[:, None]) * tl.abs(r_pr)[:, None]
        tl.store(o + o_off, acc, mask=mo)
        if HAS_DU:  # the key gate's gradient: sum over features of k ⊙ dk, per V tile
            du = tl.sum(tl.load(dg_a + o_off, mask=mo, other=0.0).to(tl.float32) * acc, 1)
            tl.store(du_out + i_v.to(tl.int64) * dg_slab + row0 + rows.to(tl.int64) * H, du, mask=mi)
        if DG > 0:
            # the log-decay gradient's per-step terms, dg_coef · a ⊙ o, from the float32 result (decay_grad.py)
            prod = tl.load(dg_a + o_off, mask=mo, other=0.0).to(tl.float32) * acc * dg_coef
            if DG == 1:  # one decay value per step: this V tile's sum, one slab per V tile
                d_off = i_v.to(tl.int64) * dg_slab + row0 + rows.to(tl.int64) * H
                part = tl.sum(prod, 1)
                if DG_ACC:
                    part += tl.load(dg_out + d_off, mask=mi, other=0.0)
                tl.store(dg_out + d_off, part, mask=mi)
            else:  # per feature: [B, T, H, V]
                if DG_ACC:
                    prod += tl.load(dg_out + o_off, mask=mo, other=0.0)
                tl.store(dg_out + o_off, prod, mask=mo)


# (rows, K tile, V tile, warps) of the launches, unless tuned (benchmarks/results/tile_sweep_h100*.json)
_TILES = {"output": (64, 64, 128, 4), "output_vec": (32, 32, 128, 4)}


def project_fits(V):
    """Whether chunk_output's rows of width V lie in one tile without decays per feature (`project` needs them)."""
    return cdiv(V, block(V, tuned("output", _TILES["output"])[2])) == 1


def chunk_output(q, k, v, b, c, border, h0, scale, layout, reverse, dot, out_dtype=torch.float32, *,
                 scale_intra=None, state_transposed=False, gate=None, gate_rows=False, dg=None, du_of=None, ones=None,
                 rank_one=None, state_dot=None, count0=None, divide=None, project=None, weight=None, qnorm=None):
    """o [B, T, H, V] in out_dtype from q, k [B, T, H, K], v [B, T, H, V] (contiguous), the chunk-local cumulative
    log decays b [Bg, T, H, K|1], c [Bg, T, H, V] (or None) and the border states of kernel 2.

    The part through the states is multiplied by `scale`, the intra-chunk part by `scale_intra` (default the
    same). state_transposed: border states and h0 are stored [.., V, K] (another pass's states, read in place).
    gate: a log key gate [B, T, H] (contiguous), on the source steps (exp(u_j) v_j) or, with gate_rows, on the
    output rows. Extras, returned after o when asked for (else o alone):
    dg = (a, out, coef, per_feature): the log-decay gradient's per-step terms coef · a ⊙ o (a shaped like o),
    float32: [B, T, H, V] per feature, else summed over each V tile, [V tiles, B, T, H]; into a new buffer when out
    is None, else added to out (a buffer of an earlier call with the same V);
    du_of = a: the sums over each V tile of a ⊙ o, [V tiles, B, T, H] float32 (a key gate's gradient);
    ones = (n_border [B, H, n, K], n0 [N, H, K] float32 or None): the forward's normalizer, what a column of ones
    appended to v would give, [B, T, H] float32, from chunk_states(..., ones=True) (decays with one value per
    step, forward); returned as (o, den). With a rank-one term of mode 1 (no decay) the normalizer counts it too:
    e_i times the steps before i plus count0 ([N, H] float32 or None, an initial state's count); divide=eps returns
    o / den instead of o (den's magnitude clamped to at least eps, its sign kept): normalized attention;
    project = (x [B, T, H, V], r [B, T, H] float32[, raw]): o is the gradient of x = y / |y| (the L2-normalized input of
    this pass's output rows, r = ±1 / |y| as utils.signed_inverse gives it; with raw true x is y itself); returns
    the gradient of y instead (V in one tile: project_fits);
    qnorm = eps (with ones): q's rows enter L2-normalized, y / max(|y|, eps), the norm taken here from the q it reads
    (not on the rank-one term); returns (o, den, r) with r = ±1 / max(|y|, eps) [B, T, H] float32 (signed_inverse);
    rank_one = (mode, e [B, T, H] float32, n_border [B, H, n, V], n0 [N, H, V] or None[, entering]): one more feature
    in the scores, e of the rows (mode 1) or of the keys (mode 2) against 1 on the other side, whose state part is
    n_border (and n0 for the first chunk going forward): the backward's dQ and dK passes of a column of ones in v
    (ula/core/ones.py); with entering true, n_border is [B * n, H, V], the vector entering each chunk in the pass's
    direction (its initial state included: n0 unused);
    weight = (mode, w [B, T, H] float32): a weight per step in the scores, mode 1 of the rows (also on the rows' part
    through the states), 2 of the keys before the rank-one term, 3 after it (the backward's passes of a division by
    the normalizer: w = 1 / d, the passes read dout, not dnum = dout / d; ula/ops/_normalized_fused.py);
    state_dot: the matmul code of the part through the states (utils.state_dot), default `dot`."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    vec = (b is not None and b.shape[-1] > 1) or c is not None
    C = layout.C
    name = "output_vec" if vec else "output"
    BT, BK, BV, W = tuned(name, _TILES[name])[:4]
    BT, BK, BV, W = min(C, BT), block(K, BK), block(V, BV), warps_for(name, W, dot)
    stages = stages_of(name, 4)
    o = alloc((B, T, H, V), q.device, out_dtype)
    dummy = border
    slabs = (cdiv(V, BV), B, T, H)
    dg_mode, dg_a, dg_out, dg_coef, dg_acc = 0, dummy, None, 0.0, False
    if dg is not None:
        dg_a, dg_out, dg_coef, per_feature = dg
        dg_mode = 2 if per_feature else 1
        dg_acc = dg_out is not None
        if dg_out is None:
            dg_out = alloc(o.shape if per_feature else slabs, q.device)
    du_out = None
    if du_of is not None:
        assert dg is None or dg_a is du_of
        dg_a = du_of
        du_out = alloc(slabs, q.device)
    s_sk, s_sv = (1, K) if state_transposed else (V, 1)
    den = n_border = n0 = r1_border = r1_n0 = None
    r1, e, entering = 0, None, False
    if rank_one is not None:
        assert not vec and (ones is None or (rank_one[0] == 1 and b is None))
        r1, e, r1_border, r1_n0 = rank_one[:4]
        entering = len(rank_one) > 4 and rank_one[4]
    # the rank-one state's (head, chunk) strides: [B, H, chunks, V] (the state kernels' layout) or, entering,
    # [B * chunks, H, V] (the scans' of ula/ops/_normalized_epilogue.py)
    r1_sh, r1_sc = (V, H * V) if entering else (layout.n * V, V)
    assert (divide is None or ones is not None) and (count0 is None or (ones is not None and r1 == 1))
    assert project is None or (cdiv(V, BV) == 1 and dg is None and du_of is None and gate is None)
    assert not (r1 and h0 is not None and not reverse and r1_n0 is None and not entering), \
        "a rank-one term's initial state is missing"
    assert weight is None or (not vec and ones is None), "weights per step: one decay value per step, no normalizer"
    if ones is not None:
        assert not vec and not reverse and dg is None and du_of is None and not state_transposed
        n_border, n0 = ones
        den = alloc((B, T, H), q.device)
    r_out = None
    if qnorm is not None:
        assert ones is not None and project is None and not vec
        r_out = alloc((B, T, H), q.device)
    # A column of ones (forward) or a rank-one term (dQ, dK) keeps the scores live: at 4 warps 64-row tiles spill
    # ~460 / ~200 B per thread on sm_90 (tests/offline_compile.py), none at 8, yet 4 warps are faster: H100 B2 T8192
    # H16 K=V=128 chunk 128, forward / dQ / dK 0.306 / 0.317 / 0.358 ms at 8 warps, 0.201 / 0.264 / 0.302 at 4
    # (benchmarks/results/ones_warps_h100_session12.txt). The forward at 4 warps with Triton's default pipelining gave
    # o that differs from call to call on identical inputs (Triton 3.6, H100; benchmarks/results/
    # ones_race_h100_session13.log) while q's tile fed both the matmul and the normalizer's float32 products q·n
    # (session 18, results/pending18_h100_session18_part6_ones_inter_mm.log); with q read again for those products the
    # forward keeps the default stages, the same o every call (normalized, normalized_pos, mLSTMexp at two shapes)
    # and faster: 0.160 / 0.194 ms against 0.181 / 0.208 at one stage for normalized / mLSTMexp
    # (results/pending19_h100_session19_part1_2.log). The dQ and dK passes with a rank-one term and a key gate or a
    # decay (mLSTMexp, linear_attention_with_ones with a decay) take one stage: 0.222 / 0.254 ms against 0.263 /
    # 0.302 with the default at 4 warps (ULA_TUNE_OUTPUT=64,64,128,4,1 in results/pending14_h100_session15.log, where
    # the default gave per-call differences too); without them (normalized attention) the default, 0.177 / 0.180
    # against 0.196 / 0.198 ms at one stage, the same dq, dk every call
    # (results/pending18_h100_session18_part{1,2}.log), as its dV pass with the a part's rank-one term
    # (results/pending17_h100_session17_stages.log).
    if r1 and state_transposed and (gate is not None or b is not None) and not is_tuned(name):
        stages = 1
    if h0 is not None and h0.dtype != border.dtype:
        # read like the border states (the matmul rounds both to its operand type alike)
        h0 = h0.to(border.dtype)
    grid = (layout.n * (C // BT), cdiv(V, BV), B * H)  # axes 1 and 2 stop at 65535
    # decays per feature: a flag per program, written by the first launch for each live row block
    flags = torch.empty(grid[0] * grid[1] * grid[2], dtype=torch.int8, device=q.device) if vec else dummy
    args = (q, k, v, b if b is not None else dummy, c if c is not None else dummy, gate if gate is not None else dummy,
            border, h0 if h0 is not None else dummy, o, dg_a, dg_out if dg_out is not None else dummy,
            du_out if du_out is not None else dummy, n_border if n_border is not None else dummy,
            n0 if n0 is not None else dummy, den if den is not None else dummy, e if e is not None else dummy,
            r1_border if r1_border is not None else dummy, r1_n0 if r1_n0 is not None else dummy,
            count0 if count0 is not None else dummy, project[0] if project is not None else dummy,
            project[1] if project is not None else (r_out if r_out is not None else dummy),
            weight[1] if weight is not None else dummy, flags,
            layout.cu, layout.chunk_seq, layout.chunk_start, T, H, K, V, layout.n, r1_sh, r1_sc,
            (b.stride(0) if b is not None and b.shape[0] > 1 else 0),
            (c.stride(0) if c is not None and c.shape[0] > 1 else 0), s_sk, s_sv, float(scale),
            float(scale if scale_intra is None else scale_intra), float(dg_coef), B * T * H,
            float(divide if divide is not None else 0.0))
    cx = dict(DB=b.shape[-1] if b is not None else 1, C=C, NRB=C // BT, BT=BT, BK=BK, BV=BV,
              HAS_B=b is not None, HAS_C=c is not None, VEC=vec, HAS_H0=h0 is not None,
              REVERSE=reverse, VARLEN=layout.varlen, DOT=dot, LOG_BT=BT.bit_length() - 1,
              DG=dg_mode, DG_ACC=dg_acc, BKF=block(K, 256),
              GATE=0 if gate is None else (2 if gate_rows else 1), HAS_DU=du_out is not None, ONES=den is not None,
              R1=r1, OWN_MAX=OWN_RANGE if dot != DOT_F16 else -1.0, SDOT=dot if state_dot is None else state_dot,
              ODOT=own_dot(dot), SPLIT_KEYS=False, HAS_C0=count0 is not None, DIVIDE=divide is not None,
              PROJECT=0 if project is None else (2 if len(project) > 2 and project[2] else 1),
              R1_ENTERING=entering and not reverse, QNORM=qnorm is not None,
              L2_EPS=float(qnorm) if qnorm is not None else 0.0,
              W=weight[0] if weight is not None else 0)
    # precision parts (ula/core/precision.py) of the core call running now; the dK and dV passes are the calls
    # with gate_rows (their border states are float32 where dg needs them)
    if gate_rows:
        cx["SDOT"] = part_dot("q_states_backward", dot, cx["SDOT"])
    cx["SPLIT_KEYS"] = vec and takes_part("split_keys", dot)
    for own in ((1, 2) if vec else (0,)):
        # the levels' launch (the rare path) at 8 warps: at 4, 32-row blocks spill up to 1 KB per thread on sm_90
        launch(_output_kernel, grid, *args, num_warps=max(W, 8) if own == 2 and not is_tuned(name) else W, **cx,
               OWN=own, num_stages=stages)
    if r_out is not None:
        return o, den, r_out
    if den is not None:
        return o, den
    if dg is None and du_of is None:
        return o
    return o, dg_out, du_out
