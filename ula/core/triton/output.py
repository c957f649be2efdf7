"""Kernel 3: the output (paper 000, Alg. 7), parallel over V tiles, row blocks of every chunk and
batch x heads.

    o_i = scale * [ (q_i e^{b_i}) S_enter e^{c_i} + sum_j (q_i . k_j e^{b_i - b_j}) v_j e^{c_i - c_j} ]

with j before i in the chunk (after i in reverse), b, c the chunk-local cumulative log decays of kernel 1.
The intra-chunk matrix is tiled: a program owns BT rows and loops over key blocks of BT, so any chunk size fits.
Off-diagonal blocks: exp(b_i - b_j) = exp(b_i - b_r) exp(b_j -> b_r) with a reference step r between the two
blocks (both factors <= 1), so the block is one matmul (paper 002 §4.3, secondary chunking; BT = 16 for decays
per feature). Diagonal block: per-element relative decays, masked before exp (no positive exponent forms)."""
import torch
import triton
import triton.language as tl

from .utils import alloc, block, mm, operand, tuned


@triton.jit
def _offdiag(q_base, k_base, v_base, b_base, c_base, rows, mi, js, ce, vc, mv, K, V, H,
             DB: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_B: tl.constexpr,
             HAS_C: tl.constexpr, VEC: tl.constexpr, REVERSE: tl.constexpr, DOT: tl.constexpr):
    """Contribution of the key block starting at js (entirely before the rows, after them in reverse)."""
    cols = js + tl.arange(0, BT)
    mj = cols < ce
    ri = rows.to(tl.int64) * H
    rj = cols.to(tl.int64) * H
    if REVERSE:
        r = js  # reference step between the query rows and the key block
    else:
        r = js + BT - 1
    A = tl.zeros([BT, BT], dtype=tl.float32)
    for kk in range(0, K, BK):
        kc = kk + tl.arange(0, BK)
        mk = kc < K
        qt = operand(tl.load(q_base + ri[:, None] * K + kc[None, :], mask=mi[:, None] & mk[None, :], other=0.0), DOT)
        kt = operand(tl.load(k_base + rj[:, None] * K + kc[None, :], mask=mj[:, None] & mk[None, :], other=0.0), DOT)
        if VEC and HAS_B:
            if DB > 1:
                br = tl.load(b_base + r.to(tl.int64) * H * DB + kc, mask=mk, other=0.0)[None, :]
                bq = tl.load(b_base + ri[:, None] * DB + kc[None, :], mask=mi[:, None] & mk[None, :], other=0.0)
                bk = tl.load(b_base + rj[:, None] * DB + kc[None, :], mask=mj[:, None] & mk[None, :], other=0.0)
            else:  # scalar left decay next to a right decay: [BT, 1] columns, broadcast over K
                br = tl.load(b_base + r.to(tl.int64) * H * DB)
                bq = tl.load(b_base + ri * DB, mask=mi, other=0.0)[:, None]
                bk = tl.load(b_base + rj * DB, mask=mj, other=0.0)[:, None]
            qt = qt * tl.exp(tl.where(mi[:, None], bq - br, float("-inf")))
            kt = kt * tl.exp(tl.where(mj[:, None], br - bk, float("-inf")))
        A += mm(qt, tl.trans(kt), DOT)
    if HAS_B and not VEC:
        bi = tl.load(b_base + ri * DB, mask=mi, other=0.0)
        bj = tl.load(b_base + rj * DB, mask=mj, other=0.0)
        A = A * tl.exp(tl.where(mi[:, None] & mj[None, :], bi[:, None] - bj[None, :], float("-inf")))
    vt = operand(tl.load(v_base + rj[:, None] * V + vc[None, :], mask=mj[:, None] & mv[None, :], other=0.0), DOT)
    if HAS_C:
        cr = tl.load(c_base + r.to(tl.int64) * H * V + vc, mask=mv, other=0.0)
        cj = tl.load(c_base + rj[:, None] * V + vc[None, :], mask=mj[:, None] & mv[None, :], other=0.0)
        ci = tl.load(c_base + ri[:, None] * V + vc[None, :], mask=mi[:, None] & mv[None, :], other=0.0)
        vt = vt * tl.exp(tl.where(mj[:, None], cr[None, :] - cj, float("-inf")))
        out = mm(A, vt, DOT) * tl.exp(tl.where(mi[:, None], ci - cr[None, :], float("-inf")))
    else:
        out = mm(A, vt, DOT)
    return out


@triton.jit
def _diag_vec(q_base, k_base, v_base, b_base, c_base, rows, mi, ce, vc, mv, K, V, H,
              DB: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LOG_BT: tl.constexpr,
              HAS_B: tl.constexpr, HAS_C: tl.constexpr, REVERSE: tl.constexpr, DOT: tl.constexpr):
    """The rows' own block with decays per feature, without per-element [BT, BT, D] work: secondary
    chunking taken down to single steps. At level h the block is cut into pieces of 2h steps; every pair
    (later half, earlier half) of a piece goes through the piece's middle step r, exp(b_i - b_j) =
    exp(b_i - b_r) exp(b_r - b_j) (both <= 1), so each level is one masked matmul. Levels h = BT/2 .. 1
    cover every pair i != j; i = j carries no decay."""
    idx = tl.arange(0, BT)
    ri = rows.to(tl.int64) * H
    vt = operand(tl.load(v_base + ri[:, None] * V + vc[None, :], mask=mi[:, None] & mv[None, :], other=0.0), DOT)
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
def _diag(q_base, k_base, v_base, b_base, rows, mi, vc, mv, K, V, H, DB: tl.constexpr, BT: tl.constexpr,
          BK: tl.constexpr, HAS_B: tl.constexpr, REVERSE: tl.constexpr, DOT: tl.constexpr):
    """Contribution of the rows' own block (keys = the same steps), causal in the direction of the pass,
    for decays without a per-feature part (one value per step)."""
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
    if HAS_B:
        bi = tl.load(b_base + ri * DB, mask=mi, other=0.0)
        A = A * tl.exp(tl.where(m, bi[:, None] - bi[None, :], float("-inf")))
    else:
        A = tl.where(m, A, 0.0)
    vt = operand(tl.load(v_base + ri[:, None] * V + vc[None, :], mask=mi[:, None] & mv[None, :], other=0.0), DOT)
    return mm(A, vt, DOT)


@triton.jit
def _output_kernel(q, k, v, b, c, border, h0, o, cu, chunk_seq, chunk_start, T, H, K, V, NC, sb_b, sc_b, scale,
                   DB: tl.constexpr, C: tl.constexpr, NRB: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, HAS_B: tl.constexpr, HAS_C: tl.constexpr, VEC: tl.constexpr,
                   HAS_H0: tl.constexpr, REVERSE: tl.constexpr, VARLEN: tl.constexpr, DOT: tl.constexpr,
                   LOG_BT: tl.constexpr):
    i_r, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # row blocks on axis 0 (up to 2^31)
    i_b, i_h = i_bh // H, i_bh % H
    i_c = i_r // NRB
    sub = i_r % NRB
    if VARLEN:
        seq = tl.load(chunk_seq + i_c)
        cs = tl.load(chunk_start + i_c)
        bos = tl.load(cu + seq)
        eos = tl.load(cu + seq + 1)
    else:
        seq = i_b
        cs = i_c * C
        bos = 0
        eos = T
    ce = tl.minimum(cs + C, eos)
    rs = cs + sub * BT
    if rs < ce:
        rows = rs + tl.arange(0, BT)
        mi = rows < ce
        ri = rows.to(tl.int64) * H
        vc = i_v * BV + tl.arange(0, BV)
        mv = vc < V
        row0 = i_b.to(tl.int64) * T * H + i_h
        q_base = q + row0 * K
        k_base = k + row0 * K
        v_base = v + row0 * V
        b_base = b + i_b.to(tl.int64) * sb_b + i_h * DB
        c_base = c + i_b.to(tl.int64) * sc_b + i_h * V
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
        for kk in range(0, K, BK):
            kc = kk + tl.arange(0, BK)
            mk = kc < K
            mik = mi[:, None] & mk[None, :]
            qt = operand(tl.load(q_base + ri[:, None] * K + kc[None, :], mask=mik, other=0.0), DOT)
            if HAS_B:
                if DB > 1:
                    qt = qt * tl.exp(tl.load(b_base + ri[:, None] * DB + kc[None, :], mask=mik, other=0.0))
                else:
                    qt = qt * tl.exp(tl.load(b_base + ri * DB, mask=mi, other=0.0))[:, None]
            kv_off = kc[:, None] * V + vc[None, :]
            mkv = mk[:, None] & mv[None, :]
            if REVERSE:
                st = tl.load(s_ptr + kv_off, mask=mkv, other=0.0).to(tl.float32)
            else:
                st = tl.load(s_ptr + kv_off, mask=mkv & from_border, other=0.0).to(tl.float32)
                if HAS_H0:
                    st += tl.load(h_ptr + kv_off, mask=mkv & first, other=0.0)
            acc += mm(qt, st, DOT)
        if HAS_C:
            ci = tl.load(c_base + ri[:, None] * V + vc[None, :], mask=mi[:, None] & mv[None, :], other=0.0)
            acc = acc * tl.exp(ci)
        # intra-chunk part: the rows' own block, then the key blocks before them (after them in reverse)
        if VEC:
            acc += _diag_vec(q_base, k_base, v_base, b_base, c_base, rows, mi, ce, vc, mv, K, V, H, DB, BT, BK, BV,
                             LOG_BT, HAS_B, HAS_C, REVERSE, DOT)
        else:
            acc += _diag(q_base, k_base, v_base, b_base, rows, mi, vc, mv, K, V, H, DB, BT, BK, HAS_B, REVERSE, DOT)
        if REVERSE:
            lo, hi = rs + BT, ce
        else:
            lo, hi = cs, rs
        for js in range(lo, hi, BT):
            acc += _offdiag(q_base, k_base, v_base, b_base, c_base, rows, mi, js, ce, vc, mv, K, V, H, DB, BT, BK,
                            BV, HAS_B, HAS_C, VEC, REVERSE, DOT)
        tl.store(o + row0 * V + ri[:, None] * V + vc[None, :], acc * scale, mask=mi[:, None] & mv[None, :])


def chunk_output(q, k, v, b, c, border, h0, scale, layout, reverse, dot, out_dtype=torch.float32):
    """o [B, T, H, V] in out_dtype from q, k [B, T, H, K], v [B, T, H, V] (contiguous), the chunk-local cumulative
    log decays b [Bg, T, H, K|1], c [Bg, T, H, V] (or None) and the border states of kernel 2."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    vec = (b is not None and b.shape[-1] > 1) or c is not None
    C = layout.C
    BT, BK, BV, W = tuned("output_vec" if vec else "output",
                          (16, 32, 128, 4) if vec else (64, 64, 128, 4))  # benchmarks/results/tile_sweep_h100*.json
    BT, BK, BV = min(C, BT), block(K, BK), block(V, BV)
    o = alloc((B, T, H, V), q.device, out_dtype)
    dummy = border
    grid = (layout.n * (C // BT), triton.cdiv(V, BV), B * H)  # axes 1 and 2 stop at 65535
    _output_kernel[grid](q, k, v, b if b is not None else dummy, c if c is not None else dummy, border,
                         h0 if h0 is not None else dummy, o, layout.cu, layout.chunk_seq, layout.chunk_start,
                         T, H, K, V, layout.n,
                         (b.stride(0) if b is not None and b.shape[0] > 1 else 0),
                         (c.stride(0) if c is not None and c.shape[0] > 1 else 0), float(scale),
                         DB=b.shape[-1] if b is not None else 1, C=C, NRB=C // BT, BT=BT, BK=BK, BV=BV,
                         HAS_B=b is not None, HAS_C=c is not None, VEC=vec, HAS_H0=h0 is not None,
                         REVERSE=reverse, VARLEN=layout.varlen, DOT=dot, LOG_BT=BT.bit_length() - 1, num_warps=W)
    return o
