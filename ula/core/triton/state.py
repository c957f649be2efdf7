"""Kernel 2: the chunk states (paper 000, Alg. 6). Sequential over the chunks of a sequence, parallel over
sequences x heads and over K and V tiles.

Going forward it stores the state after each chunk; in reverse the state entering each chunk from its right
end (these are the border states that chunk_recurrence returns and the output kernel reads back)."""
import os

import torch
import triton
import triton.language as tl

from ..backends import is_h200
from .state_join import join_segments
from .utils import (DOT_BF16, DOT_BF16_EMULATED, DOT_TF32, alloc, block, cdiv, head_bases, is_tuned, launch, mm,
                    multiprocessors, operand, round_bf16, stages_of, tuned, tuned_here, warps_for)


@triton.jit
def _row_factor(r0, ce, ok, b_base, u_base, b_end, kc, mk, H, DB: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                HAS_B: tl.constexpr, GATE: tl.constexpr):
    """The factor of k on rows r0 .. r0 + BT (before ce, none unless ok): exp(b_end - b_j) (the decay to the chunk's
    end) times exp(u_j) with a key gate; [BT, BK] for decays per feature, else [BT]."""
    rows = r0 + tl.arange(0, BT)
    mr = (rows < ce) & ok
    r64 = rows.to(tl.int64) * H
    if DB > 1:
        f = tl.zeros([BT, BK], dtype=tl.float32)
        if HAS_B:
            f += b_end[None, :] - tl.load(b_base + r64[:, None] * DB + kc[None, :], mask=mr[:, None] & mk[None, :],
                                          other=0.0)
        if GATE:
            f += tl.load(u_base + r64, mask=mr, other=0.0).to(tl.float32)[:, None]
        return tl.exp(tl.where(mr[:, None], f, float("-inf")))
    else:
        f = tl.zeros([BT], dtype=tl.float32)
        if HAS_B:
            f += b_end - tl.load(b_base + r64 * DB, mask=mr, other=0.0)
        if GATE:
            f += tl.load(u_base + r64, mask=mr, other=0.0).to(tl.float32)
        return tl.exp(tl.where(mr, f, float("-inf")))


@triton.jit
def _chunk_span(it, nc, bos, eos, C: tl.constexpr, REVERSE: tl.constexpr):
    """Step `it` of the walk over a sequence's nc chunks: the chunk's index, first step, end (exclusive) and the
    step whose cumulative decay the state takes (the chunk's last going forward, its first in reverse)."""
    if REVERSE:
        idx = nc - 1 - it
    else:
        idx = it
    cs = bos + idx * C
    ce = tl.minimum(cs + C, eos)
    if REVERSE:
        e_row = cs
    else:
        e_row = ce - 1
    return idx, cs, ce, e_row


@triton.jit
def _chunk_factors(it, nc, bos, eos, b_base, u_base, kc, mk, H, DB: tl.constexpr, C: tl.constexpr, NB: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, HAS_B: tl.constexpr, GATE: tl.constexpr, REVERSE: tl.constexpr):
    """Step `it` of the walk over chunks (nothing past the last): the chunk-end log decay b_end that the state
    takes, and the factors of k of its (up to two) row blocks."""
    ok = it < nc
    idx, cs, ce, e_row = _chunk_span(it, nc, bos, eos, C, REVERSE)
    if HAS_B:
        if DB > 1:
            b_end = tl.load(b_base + e_row.to(tl.int64) * H * DB + kc, mask=mk & ok, other=0.0)
        else:
            b_end = tl.load(b_base + e_row.to(tl.int64) * H * DB, mask=ok, other=0.0)
    else:
        b_end = 0.0
    f0 = _row_factor(cs, ce, ok, b_base, u_base, b_end, kc, mk, H, DB, BT, BK, HAS_B, GATE)
    if NB == 2:
        f1 = _row_factor(cs + BT, ce, ok, b_base, u_base, b_end, kc, mk, H, DB, BT, BK, HAS_B, GATE)
    else:
        f1 = f0
    return b_end, f0, f1


# the normalizer n is carried as a [BK, NW] block, not a [BK] vector: the three state calls of an mLSTMexp f+b
# (B2 T8192 H16 K=V=128 bf16) 0.96 -> 0.62 ms, without the column 0.43
# (benchmarks/results/state_calls_h100_session11.txt).
# Its row sums Σ_t e_t k_t (e: ones, or the gradient of the normalizer) are float32 sums: in half precision they
# cancel in the backward (session 11). SPLIT (bfloat16 matmuls, no decay or gate on k): the same sums as one matmul
# kᵀ [BT, NW] whose first three columns are e split in three bfloat16 parts, e = hi + mid + lo up to 2^-27 e: each
# product of a bfloat16 k and a part is exact in float32, so the matmul sums what the float32 code sums (normalized
# attention's three state calls 0.406 -> 0.284 ms on an H100, linear attention's 0.238); the block then holds
# partial sums in those columns (n = their sum). Otherwise it holds NW equal columns (the float32 row sum in each).
NW: tl.constexpr = tl.constexpr(16)
# Not with a factor per row (decay, gate; mLSTMexp): on an H100 both forms tried made mLSTMexp's three state calls
# slower, 0.62 -> 1.48 ms (k scaled for the state, kᵀ unscaled for the sums:
# benchmarks/results/state_calls_h100_session12_split.txt) and 0.62 -> 1.30 ms (the factor on v:
# benchmarks/results/pending12_part1_h100_session13.log).


@triton.jit
def _n_col(n, SPLIT: tl.constexpr):
    """The normalizer [BK] from its [BK, NW] block: the sum of its columns (SPLIT) or the first."""
    if SPLIT:
        x = tl.sum(n, 1)
    else:
        x = tl.sum(tl.where(tl.arange(0, NW)[None, :] == 0, n, 0.0), 1)
    return x


@triton.jit
def _store_n(ptr, kc, n, mask, SPLIT: tl.constexpr):
    """Store the normalizer [BK] at ptr + kc from its [BK, NW] block."""
    if SPLIT:
        tl.store(ptr + kc, tl.sum(n, 1), mask=mask)
    else:
        cols = tl.arange(0, NW)
        tl.store(ptr + kc[:, None] + cols[None, :] * 0, n, mask=mask[:, None] & (cols[None, :] == 0))


@triton.jit
def _split3(s, BT: tl.constexpr):
    """[BT, NW]: columns 0, 1, 2 the bfloat16 parts hi, mid, lo of s [BT] (float32; hi + mid + lo = s up to 2^-27 s,
    each exact in bfloat16), the others 0."""
    hi = round_bf16(s)
    mid = round_bf16(s - hi)
    lo = round_bf16(s - hi - mid)
    cols = tl.arange(0, NW)[None, :]
    return tl.where(cols == 0, hi[:, None], tl.where(cols == 1, mid[:, None], tl.where(cols == 2, lo[:, None], 0.0)))


@triton.jit
def _split_kernel(e, parts, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    p = _split3(tl.load(e + i, mask=m, other=0.0).to(tl.float32), BLOCK)
    tl.store(parts + i.to(tl.int64)[:, None] * NW + tl.arange(0, NW)[None, :], p.to(parts.dtype.element_ty),
             mask=m[:, None])


def split_parts(e):
    """e [B, T, H] float32 as the state kernel's SPLIT weights: [B, T, H, NW] bfloat16, columns 0-2 _split3's parts, the
    others 0. One pass before the state call: split there, inside its sequential loop over chunks, the backward's
    state call with the normalizer's gradient took 0.113 ms against 0.086 with ones, and 0.148 with the parts formed a
    chunk ahead; 0.090 + 0.004 this way (H100 B2 T8192 H16 K=V=128, benchmarks/results/pending18_h100_session18_part1,
    part2_prefetch_reverted and part2 .log)."""
    parts = torch.empty((*e.shape, int(NW)), device=e.device, dtype=torch.bfloat16)
    n = e.numel()
    launch(_split_kernel, (cdiv(n, 256),), e, parts, n, BLOCK=256)
    return parts


@triton.jit
def _rows_into_state(S, n, zs, r0, ce, k_base, v_base, c_base, e_base, w_base, c_end, f, kc, vc, mk, mv, K, V, H,
                     scale, DB: tl.constexpr, BT: tl.constexpr, HAS_F: tl.constexpr, HAS_C: tl.constexpr,
                     DOT: tl.constexpr, ONES: tl.constexpr, HAS_E: tl.constexpr, SPLIT: tl.constexpr,
                     HAS_W: tl.constexpr, VSUM: tl.constexpr):
    """S + scale (f ⊙ k)ᵀ (v decayed to the chunk's end) over rows r0 .. r0 + BT (before ce); f: the rows' factor
    of k (_row_factor); with HAS_W v's rows times w_t. With ONES also n + scale Σ_rows f ⊙ k (e_t ⊙ f ⊙ k with
    HAS_E): the state's column for one more column of v, of ones (the normalizer) or of e (its gradient, in the
    backward). With VSUM also zs + Σ_rows v (no decay, no scale): the state of a constant key 1, as n a [BV, NW]
    block."""
    rows = r0 + tl.arange(0, BT)
    mr = rows < ce
    r64 = rows.to(tl.int64) * H
    kt = operand(tl.load(k_base + r64[:, None] * K + kc[None, :], mask=mr[:, None] & mk[None, :], other=0.0), DOT)
    vt = operand(tl.load(v_base + r64[:, None] * V + vc[None, :], mask=mr[:, None] & mv[None, :], other=0.0), DOT)
    if VSUM:  # SPLIT: v is exact in bfloat16, so a matmul against a column of ones sums it in float32
        if SPLIT:
            zs = zs + mm(tl.trans(vt), tl.where(tl.arange(0, NW)[None, :] == 0, 1.0,
                                                 tl.zeros([BT, NW], dtype=tl.float32)), DOT)
        else:
            zs = zs + tl.sum(vt.to(tl.float32), 0)[:, None]
    if HAS_W:
        vt = vt * tl.load(w_base + r64, mask=mr, other=0.0)[:, None]
    if ONES and SPLIT:  # k as loaded (exact in bfloat16) against the rows' weights in three parts (or ones)
        if HAS_E:  # the parts as split_parts stored them ([B, T, H, NW] bfloat16, e_base at this head's row 0)
            cols = tl.arange(0, NW)
            sr = operand(tl.load(e_base + r64[:, None] * NW + cols[None, :], mask=mr[:, None], other=0.0), DOT)
        else:
            sr = tl.where(tl.arange(0, NW)[None, :] == 0, 1.0, tl.zeros([BT, NW], dtype=tl.float32))
        n = n + mm(tl.trans(kt), sr, DOT) * scale
    if HAS_F:  # (SPLIT is taken only without factors)
        if DB > 1:
            kt = kt * f
        else:
            kt = kt * f[:, None]
    if HAS_C:
        ct = tl.load(c_base + r64[:, None] * V + vc[None, :], mask=mr[:, None] & mv[None, :], other=0.0)
        vt = vt * tl.exp(tl.where(mr[:, None], c_end[None, :] - ct, float("-inf")))
    if ONES and not SPLIT:
        w = kt.to(tl.float32)
        if HAS_E:
            w = w * tl.load(e_base + r64, mask=mr, other=0.0).to(tl.float32)[:, None]
        n = n + tl.sum(w, 0)[:, None] * scale
    return S + mm(tl.trans(kt), vt, DOT) * scale, n, zs


@triton.jit
def _border_products(S, partner, X, b_base, c_base, bord, i_k, i_v, NKT, NVT, ce, eos, kv_off, kc, vc, mk, mv, mkv, K,
                     V, H, DB: tl.constexpr, REVERSE: tl.constexpr, n, partner_n, n_ok, ONES: tl.constexpr,
                     XR: tl.constexpr, SPLIT: tl.constexpr, n_given, NGIVEN: tl.constexpr):
    """S ⊙ partner at one chunk border (bord: its index among all [B, H, n]), times the decay of the step after the
    chunk: the border term X of the log-decay gradient (ula/core/decay_grad.py). A left decay's: row sums over this V
    tile, per K feature; a right decay's (XR): column sums over this K tile, per V feature. That step's log decay is
    in the cumulative sum already: the first row of the next chunk going forward, the chunk's last row in reverse
    (0 at a sequence's end)."""
    p = tl.load(partner + bord * K * V + kv_off, mask=mkv, other=0.0).to(tl.float32)
    if REVERSE:
        row = ce - 1
    else:
        row = ce
    ok = (ce < eos) | REVERSE  # going forward there is no next chunk at a sequence's end (decay 0 there)
    if XR:
        lam = tl.load(c_base + row.to(tl.int64) * H * V + vc, mask=mv & ok, other=0.0)
        tl.store(X + (bord * NKT + i_k) * V + vc, tl.sum(S * p, 0) * tl.exp(lam), mask=mv)
    else:
        x = tl.sum(S * p, 1)
        if ONES:  # the extra columns (n and its partner), in the first V tile's sum
            x += _n_col(n, SPLIT) * tl.load(partner_n + bord * K + kc, mask=n_ok, other=0.0).to(tl.float32)
        elif NGIVEN:  # the column's borders given (the forward's): read, not summed in the loop
            x += (tl.load(n_given + bord * K + kc, mask=n_ok, other=0.0)
                  * tl.load(partner_n + bord * K + kc, mask=n_ok, other=0.0).to(tl.float32))
        if DB > 1:
            lam = tl.load(b_base + row.to(tl.int64) * H * DB + kc, mask=mk & ok, other=0.0)
        else:
            lam = tl.load(b_base + row.to(tl.int64) * H * DB, mask=ok, other=0.0)
        tl.store(X + (bord * NVT + i_v) * K + kc, x * tl.exp(lam), mask=mk)


@triton.jit
def _state_kernel(k, v, b, c, u, h0, border, final, partner, X, n0, n_border, n_final, e, w, partner_n, z0, z_carry,
                  z_final, cu, chunk_offset, T, H, K, V, NC, NVT, sb_b, sc_b, scale, NS,
                  DB: tl.constexpr, C: tl.constexpr, NB: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  HAS_B: tl.constexpr, HAS_C: tl.constexpr, HAS_H0: tl.constexpr, REVERSE: tl.constexpr,
                  VARLEN: tl.constexpr, DOT: tl.constexpr, HAS_X: tl.constexpr, GATE: tl.constexpr, ONES: tl.constexpr,
                  HAS_E: tl.constexpr, XR: tl.constexpr, SPLIT: tl.constexpr, HAS_W: tl.constexpr,
                  VSUM: tl.constexpr, HAS_Z0: tl.constexpr, NGIVEN: tl.constexpr):
    i_nh, i_k, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # sequences x heads on axis 0
    i_n, i_h = i_nh // H, i_nh % H  # i_n: a sequence's segment (NS per sequence, _segments) and its final state's row
    if VARLEN:
        bos = tl.load(cu + i_n)
        eos = tl.load(cu + i_n + 1)
        c0 = tl.load(chunk_offset + i_n)
        i_b = i_n * 0  # B == 1
        i_seq = i_n
        first = i_n >= 0
        seq_end = eos
    else:  # segment i_s of batch row i_b: T / NS steps, whole chunks; its borders in place among the row's
        i_b, i_s = i_n // NS, i_n % NS
        bos = i_s * (T // NS)
        eos = bos + T // NS
        c0 = i_s * (T // NS // C)
        i_seq = i_b
        seq_end = T  # a segment's last border takes the decay of the next segment's first step
        if REVERSE:  # the initial state (h0, n0, z0) enters the segment the walk starts in
            first = i_s == NS - 1
        else:
            first = i_s == 0
    nc = tl.cdiv(eos - bos, C)
    NKT = tl.num_programs(1)
    kc = i_k * BK + tl.arange(0, BK)
    vc = i_v * BV + tl.arange(0, BV)
    mk, mv = kc < K, vc < V
    mkv = mk[:, None] & mv[None, :]
    row0, k_base, v_base, b_base, c_base, u_base, e_base = head_bases(k, v, b, c, u, e, i_b, i_h, T, H, K, V, sb_b,
                                                                      sc_b, DB)
    w_base = w + row0
    kv_off = kc[:, None] * V + vc[None, :]
    if SPLIT and HAS_E:  # e as its parts, NW per step (chunk_states decides SPLIT)
        e_base = e + row0 * NW
    chunk0 = (i_b.to(tl.int64) * H + i_h) * NC + c0  # this sequence's first chunk among all [B, H, n]
    bord_base = border + chunk0 * K * V
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        S += tl.load(h0 + (i_seq.to(tl.int64) * H + i_h) * K * V + kv_off, mask=mkv & first, other=0.0).to(tl.float32)
    # ONES (decays with one value per step): n, the state's column for one more column of v (ones, or e with
    # HAS_E), kept by every V tile and stored by the first
    n = tl.zeros([BK, NW], dtype=tl.float32)
    n_ok = mk & (i_v == 0)
    if ONES and HAS_H0:
        n0v = tl.load(n0 + (i_seq.to(tl.int64) * H + i_h) * K + kc, mask=mk & first, other=0.0)[:, None]
        if SPLIT:  # a partial sum: in the first column only
            n0v = tl.where(tl.arange(0, NW)[None, :] == 0, n0v, 0.0)
        n += n0v
    # VSUM (forward, no decay): zs = z0 + Σ v, kept by every K tile and stored by the first, before each chunk (the
    # vector entering it, [B * chunks, H, V]) and after the last
    zs = tl.zeros([BV, NW], dtype=tl.float32)
    z_ok = mv & (i_k == 0)
    if VSUM and HAS_Z0:
        z0v = tl.load(z0 + (i_seq.to(tl.int64) * H + i_h) * V + vc, mask=mv & first, other=0.0)[:, None]
        if SPLIT:
            z0v = tl.where(tl.arange(0, NW)[None, :] == 0, z0v, 0.0)
        zs += z0v
    HAS_F: tl.constexpr = HAS_B or GATE
    # the decays of a chunk are loaded one chunk ahead: a program of this sequential loop has no other warps to
    # hide a load's latency behind, and it would wait for them every chunk (k and v are pipelined by the compiler)
    if HAS_F and NB <= 2:
        nb_end, nf0, nf1 = _chunk_factors(0, nc, bos, eos, b_base, u_base, kc, mk, H, DB, C, NB, BT, BK, HAS_B, GATE,
                                          REVERSE)
    for it in range(0, nc):
        idx, cs, ce, e_row = _chunk_span(it, nc, bos, eos, C, REVERSE)
        if VSUM:
            _store_n(z_carry + ((i_b.to(tl.int64) * NC + c0 + idx) * H + i_h) * V, vc, zs, z_ok, SPLIT)
        if REVERSE:
            tl.store(bord_base + idx.to(tl.int64) * K * V + kv_off, S, mask=mkv)
            if ONES:
                _store_n(n_border + (chunk0 + idx) * K, kc, n, n_ok, SPLIT)
            if HAS_X:
                _border_products(S, partner, X, b_base, c_base, chunk0 + idx, i_k, i_v, NKT, NVT, ce, seq_end, kv_off,
                                 kc, vc, mk, mv, mkv, K, V, H, DB, REVERSE, n, partner_n, n_ok, ONES, XR, SPLIT,
                                 n_border, NGIVEN)
        b_end = 0.0
        c_end = 0.0
        if HAS_F and NB <= 2:
            b_end, f0, f1 = nb_end, nf0, nf1
            nb_end, nf0, nf1 = _chunk_factors(it + 1, nc, bos, eos, b_base, u_base, kc, mk, H, DB, C, NB, BT, BK,
                                              HAS_B, GATE, REVERSE)
        elif HAS_B:
            if DB > 1:
                b_end = tl.load(b_base + e_row.to(tl.int64) * H * DB + kc, mask=mk, other=0.0)
            else:
                b_end = tl.load(b_base + e_row.to(tl.int64) * H * DB)
        if HAS_B:
            if DB > 1:
                S = S * tl.exp(b_end)[:, None]
            else:  # a scalar decay: one value per step, broadcast over K
                S = S * tl.exp(b_end)
                n = n * tl.exp(b_end)
        if HAS_C:
            c_end = tl.load(c_base + e_row.to(tl.int64) * H * V + vc, mask=mv, other=0.0)
            S = S * tl.exp(c_end)[None, :]
        # up to two row blocks of a chunk are unrolled, so the loop over chunks is the innermost loop and the
        # compiler pipelines the next chunk's loads under this chunk's matmuls; longer chunks loop (unrolled,
        # every block's tiles would stay in shared memory at once)
        if NB <= 2:
            if HAS_F:
                S, n, zs = _rows_into_state(S, n, zs, cs, ce, k_base, v_base, c_base, e_base, w_base, c_end, f0, kc,
                                            vc, mk, mv, K, V, H, scale, DB, BT, HAS_F, HAS_C, DOT, ONES, HAS_E, SPLIT,
                                            HAS_W, VSUM)
                if NB == 2:
                    S, n, zs = _rows_into_state(S, n, zs, cs + BT, ce, k_base, v_base, c_base, e_base, w_base, c_end,
                                                f1, kc, vc, mk, mv, K, V, H, scale, DB, BT, HAS_F, HAS_C, DOT, ONES,
                                                HAS_E, SPLIT, HAS_W, VSUM)
            else:
                for sb in tl.static_range(NB):
                    S, n, zs = _rows_into_state(S, n, zs, cs + sb * BT, ce, k_base, v_base, c_base, e_base, w_base,
                                                c_end, 0.0, kc, vc, mk, mv, K, V, H, scale, DB, BT, HAS_F, HAS_C, DOT,
                                                ONES, HAS_E, SPLIT, HAS_W, VSUM)
        else:
            for sb in range(NB):
                f = 0.0
                if HAS_F:
                    f = _row_factor(cs + sb * BT, ce, True, b_base, u_base, b_end, kc, mk, H, DB, BT, BK, HAS_B, GATE)
                S, n, zs = _rows_into_state(S, n, zs, cs + sb * BT, ce, k_base, v_base, c_base, e_base, w_base, c_end,
                                            f, kc, vc, mk, mv, K, V, H, scale, DB, BT, HAS_F, HAS_C, DOT, ONES, HAS_E,
                                            SPLIT, HAS_W, VSUM)
        if not REVERSE:
            tl.store(bord_base + idx.to(tl.int64) * K * V + kv_off, S, mask=mkv)
            if ONES:
                _store_n(n_border + (chunk0 + idx) * K, kc, n, n_ok, SPLIT)
            if HAS_X:
                _border_products(S, partner, X, b_base, c_base, chunk0 + idx, i_k, i_v, NKT, NVT, ce, seq_end, kv_off,
                                 kc, vc, mk, mv, mkv, K, V, H, DB, REVERSE, n, partner_n, n_ok, ONES, XR, SPLIT,
                                 n_border, NGIVEN)
    tl.store(final + (i_n.to(tl.int64) * H + i_h) * K * V + kv_off, S, mask=mkv)
    if ONES:
        _store_n(n_final + (i_n.to(tl.int64) * H + i_h) * K, kc, n, n_ok, SPLIT)
    if VSUM:
        _store_n(z_final + (i_n.to(tl.int64) * H + i_h) * V, vc, zs, z_ok, SPLIT)


def narrow_on_h200(dot, per_feature, NS, programs, sms, device):
    """Whether the state kernel takes K tiles of 32 on an H200: its matmuls in tf32 (GLA's default precision) with
    decays per feature, no split along T and about one program per multiprocessor at the default tiles; then two per
    multiprocessor. B2 T8192 H16 K=V=128, 128 programs: GLA f+b 3.11 -> 2.94 ms, but HGRN2 (bfloat16 matmuls) 3.31 ->
    3.34-3.40 (results/pending40_h200_session40_part2.log); the H100 was faster with the wider tile (session 9). Fewer
    programs are the split's (`segments`, ula/core/time_split.py)."""
    return (dot == DOT_TF32 and per_feature and NS == 1 and sms < 2 * programs <= 2 * sms and is_h200(device))


# (steps, K tile, V tile, warps) of the state kernel, unless tuned or narrowed below (ula/core/time_split.py counts
# its programs with them too)
STATE_TILES = (128, 64, 64, 8)


def chunk_states(k, v, b, c, h0, layout, reverse, dot, state_dtype=torch.float32, scale=1.0, partner=None, gate=None,
                 ones=False, n0=None, e=None, partner_n=None, partner_right=False, w=None, v_sums=False, z0=None,
                 n_given=None):
    """k [B, T, H, K], v [B, T, H, V] contiguous; b [Bg, T, H, K|1], c [Bg, T, H, V] chunk-local cumulative
    log decays (or None); h0 [N, H, K, V] float32 contiguous or None; every k_tᵀ v_t enters times `scale` (and
    exp(gate_t) with a log key gate [B, T, H], contiguous).
    Returns the border states [B, H, n, K, V] in state_dtype, the final state [N, H, K, V] float32 (before the
    extra decay of a reverse pass) and, with a partner (the border states of the opposite direction, same
    shape), the log-decay gradient's border terms [B, H, n, V tiles, K] float32 (else None); partner_right: a right
    decay's, [B, H, n, K tiles, V].
    ones (decays with one value per step): also the state's column for one more column of v, of ones or of e
    [B, T, H] (float32, contiguous), from n0 [N, H, K] float32 (or zero): returned after X as (n_border [B, H, n, K]
    float32 with a decay or gate, else in state_dtype, n_final [N, H, K] float32); with a partner, its column
    partner_n joins the border terms.
    n_given [B, H, n, K] float32 (not with ones; with partner and partner_n): the column's border values as the
    forward's call returned them, for the border terms; the loop sums no column (the backward's second call of
    mLSTMexp on an H200: 0.38 -> 0.20 ms at B2 T8192 H16, 1.23 -> 1.01 ms at B1 T65536; RESULTS.md session 46)
    w [B, T, H] float32 (contiguous): v's rows times w_t, not e's (the backward of a division by the normalizer,
    ula/ops/_normalized_fused.py: v = dout, w = 1 / d).
    v_sums (with ones, going forward, no decay): also the state of a constant key 1 (normalized attention's a part,
    z0 [N, H, V] float32 or zero + Σ v, unscaled), returned last as (the vector entering each chunk [B * chunks, H, V],
    the final one [N, H, V]) float32: the pass over v that summed each chunk before the forward
    (0.037 ms at B2 T8192 H16 V=128 on an H100) and its scan gone."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    N = layout.N
    # a long sequence with few programs: its segments walked side by side, then joined (state_join.py)
    given = n_given is not None
    assert not (given and (ones or partner is None or partner_n is None or n_given.dtype != torch.float32))
    # split as the same call with the column would be (the forward's, whose borders these are)
    NS = segments(layout, T, H, K, V, c is not None, b is not None, k.device, ones or given)
    border = alloc((B, H, layout.n, K, V), k.device, state_dtype)
    final = alloc((N * NS, H, K, V), k.device)
    # 8 warps: a program of this sequential loop is alone on its multiprocessor (one warp per scheduler at 4
    # warps, latency-bound in Nsight Compute); B=1 T=65536 H=16 constant decay f+b 4.79 -> 4.06 ms, B=2 T=8192
    # vector 4.89 -> 4.70 (benchmarks/results/tile_sweep_h100_session9_*.json)
    BT, BK, BV, W = tuned("state", STATE_TILES)[:4]
    BT, BK, BV, W = min(layout.C, BT), block(K, BK), block(V, BV), warps_for("state", W, dot)
    # few sequences x heads leave most multiprocessors idle: narrower K tiles give twice the programs (B=1
    # T=65536 H=16 constant decay 5.39 -> 4.86 ms in tile_sweep_h100_b1t65536.json); with one decay value per
    # step also up to two programs per multiprocessor (B=2 T=8192 H=16 scalar 1.45 -> 1.29 ms; no decay and
    # decays per feature are faster with the wider tile there)
    programs = N * NS * H * cdiv(K, BK) * cdiv(V, BV)
    sms = multiprocessors(k.device)
    one_per_step = b is not None and b.shape[-1] == 1 and c is None
    if BK > 32 and not is_tuned("state") and (2 * programs <= sms or (one_per_step and programs <= 2 * sms)):
        BK = 32
    if BK > 32 and not is_tuned("state") and narrow_on_h200(dot, (b is not None and b.shape[-1] > 1) or c is not None,
                                                            NS, programs, sms, k.device):
        BK = 32
    # a small state (GSA's m = 64 slots on one side) under one program per multiprocessor: 32 x 32 tiles at 4
    # warps, four times the programs (H100 B2 T8192 H16 GSA f+b, chunk 64: 5.21 -> 4.99 ms; chunk 128: 4.77,
    # tile_sweep_h100_session10_gsa*.json)
    if min(K, V) <= 64 and programs < sms and not is_tuned("state"):
        BK, BV, W = min(BK, 32), min(BV, 32), 4
    NVT = cdiv(V, BV)
    X = None
    if partner is not None:
        X = alloc((B, H, layout.n, cdiv(K, BK), V) if partner_right else (B, H, layout.n, NVT, K), k.device)
    n_border = n_final = None
    # SPLIT (see NW): the normalizer with bfloat16 matmuls (emulated too) and k entering as loaded (no decay, no gate);
    # its weights e are read as their parts
    split = ones and dot in (DOT_BF16, DOT_BF16_EMULATED) and b is None and gate is None
    # 4 warps for those (normalized attention's three calls; with 4 stages below): H200 B2 T8192 H16 K=V=128
    # 0.087 / 0.091 / 0.063 -> 0.072 / 0.079 / 0.061 ms, while linear attention's calls are the same at 4 or 8
    # (RESULTS.md session 22)
    if split and not is_tuned("state"):
        W = 4
    if split and e is not None:
        e = split_parts(e)
    if ones:
        assert c is None and (b is None or b.shape[-1] == 1) and (partner is None or partner_n is not None)
        # with a decay or gate float32 whatever the states' dtype (mLSTMexp: bf16 borders were its gradients' largest
        # error where nᵀq cancels; the backward reads them again); without (normalized attention) in the states'
        # dtype: float32 there took its f+b 0.917 -> 0.939 ms on an H200 (RESULTS.md session 46)
        n_border = alloc((B, H, layout.n, K), k.device,
                         torch.float32 if b is not None or gate is not None else state_dtype)
        n_final = alloc((N * NS, H, K), k.device)
    z_carry = z_final = None
    if v_sums:
        assert ones and not reverse and b is None and c is None and gate is None and w is None
        z_carry = alloc((B * layout.n, H, V), k.device)
        z_final = alloc((N * NS, H, V), k.device)
    DB = b.shape[-1] if b is not None else 1
    dummy = border
    grid = (N * NS * H, cdiv(K, BK), NVT)  # axes 1 and 2 stop at 65535
    # 4 software-pipelining stages where no decay or gate enters the loop (Triton's default 3 elsewhere; fewer where
    # they do not fit): on an H200 B2 T8192 H16 K=V=128 f+b linear attention 0.704 -> 0.688 ms, normalized 0.962 ->
    # 0.952; with decays or a key gate not (mLSTMexp 1.57 -> 1.66, GSA 4.41 -> 4.45; RESULTS.md session 22). Hopper
    # only: compiled for an A100 at 4 stages, normalized attention's reverse call spills 6 KB per thread (0.5 KB at
    # Triton's default 3; results/offline_compile_sm80_triton3.6.0.txt)
    stages = stages_of("state", 4)
    if stages is None and b is None and c is None and gate is None and tuned_here(k.device):
        stages = (4, None, 2, 1)
    launch(_state_kernel, grid, k, v, b if b is not None else dummy, c if c is not None else dummy,
           gate if gate is not None else dummy, h0 if h0 is not None else dummy, border, final,
           partner if partner is not None else dummy, X if X is not None else dummy,
           n0 if n0 is not None else dummy, n_border if ones else (n_given if given else dummy),
           n_final if ones else dummy,
           e if e is not None else dummy, w if w is not None else dummy, partner_n if partner_n is not None else dummy,
           z0 if z0 is not None else dummy, z_carry if v_sums else dummy, z_final if v_sums else dummy, layout.cu,
           layout.chunk_offset, T, H, K, V, layout.n, NVT,
           (b.stride(0) if b is not None and b.shape[0] > 1 else 0),
           (c.stride(0) if c is not None and c.shape[0] > 1 else 0), float(scale), NS,
           DB=DB, C=layout.C, NB=layout.C // BT, BT=BT, BK=BK, BV=BV, HAS_B=b is not None, HAS_C=c is not None,
           HAS_H0=h0 is not None, REVERSE=reverse, VARLEN=layout.varlen, DOT=dot, HAS_X=X is not None,
           GATE=gate is not None, ONES=ones, HAS_E=e is not None, XR=partner_right, SPLIT=split, HAS_W=w is not None,
           VSUM=v_sums, HAS_Z0=v_sums and z0 is not None, NGIVEN=given, num_warps=W, num_stages=stages)
    if NS > 1:
        final, n_final, z_final = join_segments(b, reverse, NS, layout.C, border, final, n_border, n_final, z_carry,
                                                 z_final, (partner, partner_n, X))
    if v_sums:
        return border, final, X, (n_border, n_final), (z_carry, z_final)
    if ones:
        return border, final, X, (n_border, n_final)
    return border, final, X


# Segments of a long sequence walked side by side (chunk_states): the shortest segment split off. Forced with
# ULA_STATE_SPLIT=S (1: never), for measurements; module variable _FORCED for tests.
MIN_SEGMENT = 4096
_FORCED = os.environ.get("ULA_STATE_SPLIT")


def segments(layout, T, H, K, V, excluded, decayed, device, ones=False):
    """Segments per sequence of a state call (1: none): double them while the programs at the default tiles stay
    within the multiprocessors, segments hold whole chunks and at least MIN_SEGMENT steps. Never with varlen or a right
    decay (excluded); with a left decay only at 4 segments or more, unless the call has the column of ones (`ones`).
    On an H100, f+b, all three state calls split (benchmarks/results/state_split_decays_terms_h100_session29.json): at
    B1 T16384 H8, 4 segments, scalar / vector / mLSTMexp / mLSTMsig / GLA -10 / -21 / -18 / -13 / -15% against no
    split, and 2-5% faster than the core's own split (ula/core/time_split.py, which leaves such calls to this one); at
    B1 T32768 H16, 2 segments, +2 / -6 / -1 / -1 / +2%. Without a decay normalized attention gained 23-36%
    (state_split_h100_session29.json). The column of ones with a decay is mLSTMexp's, whose calls the core's own split
    does not take: 2 segments on an H200, B1 H16 f+b, T 32768 / 65536 / 131072: -3 / -4 / -5%
    (results/state_sweep2_mlstm_exp_h200_session44.txt, GPU kernel sums)."""
    if layout.varlen or excluded:
        return 1
    return segment_count(layout.N, T, H, K, V, layout.C, decayed and not ones, device)


def segment_count(N, T, H, K, V, C, decayed, device):
    """segments() for N sequences of T steps in chunks of C, neither varlen nor with a right decay."""
    if _FORCED is not None:
        S = int(_FORCED)
        return S if S > 1 and T % (S * C) == 0 else 1
    S = split_count(N, T, H, K, V, C, MIN_SEGMENT, device)
    return 1 if decayed and S < 4 else S


def split_count(N, T, H, K, V, step, shortest, device):
    """How many segments N sequences of T steps split into to fill the GPU (this kernel's split and
    ula/core/time_split.py's): doubled while the state kernel's programs at its default tiles times the segments stay
    within the multiprocessors, and segments hold whole `step`s and at least `shortest` steps."""
    programs = N * H * cdiv(K, block(K, STATE_TILES[1])) * cdiv(V, block(V, STATE_TILES[2]))
    sms = multiprocessors(device)
    S = 1
    while programs * S * 2 <= sms and T % (S * 2 * step) == 0 and T // (S * 2) >= shortest:
        S *= 2
    return S
