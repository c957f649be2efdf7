"""The mLSTMexp gate scan (ula/ops/mlstm.py: `_exp_gates`) as Triton kernels, two launches forward, two backward.

Forward, per sequence (a batch row, or a sequence of a packed batch) and head, along time t, from the gate
pre-activations i, f and the initial max state m_0 (0 without one; the "base" b below):

    lf_t = logσ(f_t),   F_t = Σ_{u<=t} lf_u,   y_t = i_t − F_t
    M⁰_t = max_{s<=t} y_s  (arg-max J_t),   M_t = max(b, M⁰_t),   m_t = F_t + M_t
    ld'_t = min(lf_t + m̂_{t−1} − m̂_t, 0) = M_{t−1} − M_t   (M_{−1} = b)
    logw_t = min(i_t − m̂_t, 0) = y_t − M_t

and m_T, m at each sequence's last step. m̂ is m detached. The two right-hand forms are the same numbers
without F: F_{t−1} + lf_t − F_t is 0, so the decay is the step of M (<= 0 as M does not decrease) and the weight
is y_t − M_t (<= 0 as M_t >= y_t). They are exact in float64 where the PyTorch code's lf + (m̂_{t−1} − m̂_t)
rounds at the size of F (which grows linearly with t), and the core's telescoping sums stay exact: the weight
of step s at step t is exp(logw_s + Σ_{s<u<=t} ld'_u) = exp(y_s − M_t). The min(·, 0) only removes what
rounding could leave above 0 (none here), with the gradient passed straight through as in the PyTorch code.
Everything is float64 inside (F grows linearly in T; float64 keeps y = i − F exact enough); ld' and logw are
written in the dtype the core takes (the PyTorch path casts them to it), m and m_T in float64.

Blocks. The sequence is cut in blocks of BT steps (and BH heads; see `_tiles` for the defaults), walked
with a carry: F (the last cumulative sum), and (M⁰, J) of the steps so far. Within a block, tl.cumsum gives F
and one tl.associative_scan gives, per step, the running max with its arg-max (ties to the later index, NaN
above everything: torch.cummax) and the max over the *earlier* steps (for M_{t−1}: the scan of pairs (max
without the last element, max) of a run, which is associative). When a gradient is needed, the forward writes
per step J_t and which of M⁰_t, b gives M_t (int32: 4 J + code, code 2 when M⁰_t > b, 1 on a tie, 0 when b wins;
without m_0 the floor 0 is torch's clamp_min: code 2 when M⁰_t >= 0), which is all the backward needs besides f
(sequences up to 2^29 steps). Sequential kernels (PARALLEL = False): one program per (sequence, head block)
walks its blocks. Parallel kernels (the default): a program per (block, head block), two launches each way,
the second taking its carry from the summaries that the first writes per block (see "Parallel" below).

Backward. The PyTorch code's gradients, by its autograd graph: ld' and logw reach lf and i only directly (m̂
detached, the min straight-through); m and m_T are live. With G_t = dm_t + [t = last] dm_T:
    m = F + M:  dF_t += G_t,  dM_t = G_t
    M = max(M⁰, m_0):  dM⁰_t = w_t G_t,  dm_0 = Σ_t (1 − w_t) G_t,  w_t = 1, 1/2 (tie: torch.maximum splits
        the gradient evenly), 0 by the code; clamp_min(0) (no m_0): w_t = [M⁰_t >= 0]
    M⁰ = cummax(y):  dy_s = A_s = Σ_{t: J_t = s} dM⁰_t  (cummax sends each step's gradient to its arg-max)
    y = i − F:  di_s = dlogw_s + A_s,  dF_s −= A_s
    F = cumsum(lf):  dlf_u = dld'_u + Σ_{s>=u} (G_s − A_s),  df_u = dlf_u σ(−f_u)   (logσ' = σ(−f))
A is a scatter onto the arg-max, a segmented sum: J is nondecreasing in t and J_t <= t, and J_t = s for
some t > s only if J_s = s (s is then the arg-max of a longer prefix, so of its own). So the steps sending
to s are a contiguous run that starts at s, and A_s = [J_s = s] Σ_{t >= s, J_t = J_s} w_t G_t. The backward
walks the blocks in reverse: in a block the sum over each run is a reverse associative scan of (J_t, w_t G_t)
with the (min key, sum of the values with that key) combine (commutative; with J nondecreasing, the value at
t sums the steps t.. of t's run). Runs cross block borders only one way: steps of later blocks whose arg-max
is earlier than block [a, c) all have the arg-max J_{c−1} (the arg-max of a longer prefix lying in [0, c) is
that of [0, c)), so the carry into a block is one number per head, added to its last step, and the carry out
of it is its first step's run sum when J_a < a. The reverse cumsum of G − A runs with a carry too.

Parallel. Blocks are numbered flat, a sequence's after those of the sequences before it (cdiv(T, BT) each, or with
cu_seqlens max(1, cdiv(L, BT)), which each program finds from cu_seqlens itself: no layout to build, no host sync;
the grid takes the bound T // BT + N and blocks past the last one write nothing). Forward: (1) per block, Σ logσ(f)
and the arg-max J of y' = i − F_local (F_local: the in-block cumsum; the cummax order) with i_J and F_local,J; (2)
per block, the walk's carry from the summaries of its sequence's earlier blocks, read NC at a time: F before each
block is an exclusive prefix sum of the block sums (F re-associated by block: the one sum that the ordering allows
to change), y at each earlier block's arg-max is recomputed as i_J − (F_local,J + F before the block), the very y
that the block's own program computes there (both programs' tl.cumsum over the same tile shape and warps, so
associated alike), and their max in the cummax order (a total order: later block on ties) is (M⁰, J); then the
block as the walk does it, the sequence's last block writing m_T. So the carry is the walk's, but for blocks where
y' and y rank two steps differently, steps within rounding of F of each other (measure zero, as under Ties).
Backward: (1) per block, its first step's arg-max kf, P = Σ x over its steps with that arg-max (x = w G) and D = Σ
(1 − w) G = Σ G − Σ x; (2) per block, the walk's carry from the later blocks' summaries: pend = E = Σ P over the
later blocks whose kf is the arg-max J_{c−1} at this block's end (the blocks that the run of J_{c−1} reaches:
contiguous), and cR = Σ (G − A) over the later steps = Σ D over the later blocks + E (their A sum every x whose
arg-max lies in a later block: all of their x but E's); then the block as the walk does it; the sequence's first
block writes dm_0 = Σ D over all its blocks. The gradients' sums are re-associated too (rounding only).

Ties. Ties between M⁰ and m_0 and within the cummax are resolved exactly as the PyTorch code does (later
index; 1/2 each; clamp_min's >=), so the gradients agree on ties too (tested with exact ties, where lf = 0).
The forward sums F in a different order from torch.cumsum, so two y within rounding of each other may rank
differently from the PyTorch code: a set of inputs of measure zero."""
import torch
from torch.autograd.function import once_differentiable
import triton
import triton.language as tl

from ..core.triton.utils import INTERPRET, alloc, cdiv, launch, tuned
from ._packed_blocks import _block, _grid, _seq_piece, _span

# True: the parallel kernels (two launches each way, see the docstring); False: one program walks each sequence
# (the first version, kept for benchmarks/gpu_gate_tiles.py --sequential)
PARALLEL = True
# ... for calls of at most this many sequences x heads: each parallel program searches cu_seqlens for its block
# (N / 1024 passes), and many sequences x heads give the sequential walk programs enough (and short walks)
PARALLEL_MAX_SEQ_HEADS = 1024


def _parallel(N, H):
    return PARALLEL and N * H <= PARALLEL_MAX_SEQ_HEADS


@triton.jit
def _max_scan(e1, v1, j1, e2, v2, j2):
    """Two adjacent runs, the first earlier, each as (max of all but its last step, max, arg-max)."""
    later = (v2 >= v1) | (v2 != v2)  # torch.cummax: the later index on ties, NaN above everything
    return tl.where(e2 > v1, e2, v1), tl.where(later, v2, v1), tl.where(later, j2, j1)


@triton.jit
def _max_arg(v1, j1, v2, j2):
    """(max, arg-max) of two (value, step) with torch.cummax's order (NaN above everything, then the value, then the
    later step): a total order, so commutative as tl.reduce wants (steps are distinct)."""
    second = ((v2 != v2) & ((v1 == v1) | (j2 > j1))) | ((v1 == v1) & ((v2 > v1) | ((v2 == v1) & (j2 > j1))))
    return tl.where(second, v2, v1), tl.where(second, j2, j1)


@triton.jit
def _run_sum(k1, x1, k2, x2):
    """(smallest key, sum of the values with it): over a run of nondecreasing keys, the sum of its first key's."""
    k = tl.minimum(k1, k2)
    return k, tl.where(k1 == k, x1, 0.0) + tl.where(k2 == k, x2, 0.0)


@triton.jit
def _program(cu, N, T, H, NB, BT: tl.constexpr, BH: tl.constexpr, NS: tl.constexpr, VARLEN: tl.constexpr):
    """A parallel program's (flat block, head block): its sequence, block bounds (_block), step offsets in the
    block and heads (with their mask)."""
    p, i_h = tl.program_id(0), tl.program_id(1)
    n, bos, L, start, c0, c1 = _block(p, cu, N, T, NB, BT, NS, VARLEN)
    hc = i_h * BH + tl.arange(0, BH)
    return p, n, bos, L, start, c0, c1, tl.arange(0, BT), hc, hc < H


@triton.jit
def _base(x, n, bos, hc, s_b, s_t, s_h, VARLEN: tl.constexpr):
    """Row 0 of sequence n of a strided [B, T, H] input, heads hc (packed: batch row 0, rows bos..)."""
    if VARLEN:
        return x + bos * s_t + hc * s_h
    else:
        return x + n.to(tl.int64) * s_b + hc * s_h


@triton.jit
def _log1p_exp_neg_abs(x):
    """log(1 + exp(−|x|)) in float64 (logσ(x) = min(x, 0) − this), log1p by Kahan's (1 + z) correction."""
    z = tl.exp(-tl.abs(x))
    u = 1.0 + z
    return tl.where(u == 1.0, z, tl.log(u) * (z / tl.where(u == 1.0, 1.0, u - 1.0)))


@triton.jit
def _lf_cumsum(pf, roff, msk):
    """In-block cumulative sum of logσ(f) (padded steps add 0), float64."""
    x = tl.load(pf + roff, mask=msk, other=0.0).to(tl.float64)
    lf = tl.minimum(x, 0.0) - _log1p_exp_neg_abs(x)
    return tl.cumsum(tl.where(msk, lf, 0.0), 0)


@triton.jit
def _fwd_block(pi, pf, si_t, sf_t, po, ldp, logw, m, code, H, start, L, ar, mh, b, cF, cM, cJ,
               BT: tl.constexpr, BH: tl.constexpr, HAS_M0: tl.constexpr, SAVE: tl.constexpr):
    """The steps [start, start + BT) of a sequence after the carry (F, max of y and its step) of the steps before
    them: writes their outputs, returns the carry after them."""
    rows = start + ar
    msk = (rows < L)[:, None] & mh[None, :]
    r64 = rows.to(tl.int64)[:, None]
    Fc = _lf_cumsum(pf, r64 * sf_t, msk) + cF[None, :]
    y = tl.load(pi + r64 * si_t, mask=msk, other=0.0).to(tl.float64) - Fc
    y = tl.where(msk, y, float("-inf"))
    E, M0, J = tl.associative_scan((tl.full([BT, BH], float("-inf"), tl.float64), y,
                                    tl.broadcast_to(rows[:, None], [BT, BH])), 0, _max_scan)
    # join the steps of the earlier blocks (the carry) in front
    E = tl.where(E > cM[None, :], E, cM[None, :])
    later = (M0 >= cM[None, :]) | (M0 != M0)
    M0 = tl.where(later, M0, cM[None, :])
    J = tl.where(later, J, cJ[None, :])
    bb = b[None, :]
    if HAS_M0:  # torch.maximum(M0, m0): NaN from either side
        M = tl.where((M0 < bb) | (bb != bb), bb, M0)
        Mp = tl.where((E < bb) | (bb != bb), bb, E)
        wc = tl.where(M0 > bb, 2, tl.where(M0 == bb, 1, 0))
    else:  # clamp_min(0)
        M = tl.where(M0 < 0.0, 0.0, M0)
        Mp = tl.where(E < 0.0, 0.0, E)
        wc = tl.where(M0 >= 0.0, 2, 0)
    d = Mp - M
    w = y - M
    off = po + r64 * H
    tl.store(ldp + off, tl.where(d > 0.0, 0.0, d).to(ldp.dtype.element_ty), mask=msk)
    tl.store(logw + off, tl.where(w > 0.0, 0.0, w).to(logw.dtype.element_ty), mask=msk)
    tl.store(m + off, Fc + M, mask=msk)
    if SAVE:
        tl.store(code + off, J * 4 + wc, mask=msk)
    last = (ar == BT - 1)[:, None]  # padded steps keep F and the max: the block's last row is the carry
    return tl.sum(tl.where(last, Fc, 0.0), 0), tl.sum(tl.where(last, M0, 0.0), 0), tl.sum(tl.where(last, J, 0), 0)


@triton.jit
def _m_T(cF, cM, b, HAS_M0: tl.constexpr):
    """m at the last step from the carry after it."""
    if HAS_M0:
        MT = tl.where((cM < b) | (b != b), b, cM)
    else:
        MT = tl.where(cM < 0.0, 0.0, cM)
    return cF + MT


@triton.jit
def _per_head(x, n, H, hc, mh, HAS: tl.constexpr, BH: tl.constexpr):
    """Sequence n's values of an [N, H] tensor (m_0, or the gradient of m_T) for heads hc in float64, or zeros."""
    if HAS:
        return tl.load(x + n * H + hc, mask=mh, other=0.0).to(tl.float64)
    else:
        return tl.zeros([BH], dtype=tl.float64)


@triton.jit
def _mlstm_gates_fwd_seq_kernel(i, f, m0, cu, ldp, logw, m, mT, code, T, H, si_b, si_t, si_h, sf_b, sf_t, sf_h,
                                BT: tl.constexpr, BH: tl.constexpr, VARLEN: tl.constexpr, HAS_M0: tl.constexpr,
                                SAVE: tl.constexpr):
    """Sequential forward: one program per (sequence, head block) walks its sequence."""
    n, i_h = tl.program_id(0), tl.program_id(1)  # sequences on axis 0 (up to 2^31)
    bos, L = _span(n, cu, T, VARLEN)
    ar = tl.arange(0, BT)
    hc = i_h * BH + tl.arange(0, BH)
    mh = hc < H
    pi = _base(i, n, bos, hc, si_b, si_t, si_h, VARLEN)
    pf = _base(f, n, bos, hc, sf_b, sf_t, sf_h, VARLEN)
    po = (bos * H + hc)[None, :]
    b = _per_head(m0, n, H, hc, mh, HAS_M0, BH)
    cF = tl.zeros([BH], dtype=tl.float64)  # F at the last step so far
    cM = tl.full([BH], float("-inf"), tl.float64)  # max of y so far, and its step
    cJ = tl.zeros([BH], dtype=tl.int32)
    for start in range(0, L, BT):
        cF, cM, cJ = _fwd_block(pi, pf, si_t, sf_t, po, ldp, logw, m, code, H, start, L, ar, mh, b, cF, cM, cJ,
                                BT, BH, HAS_M0, SAVE)
    tl.store(mT + n * H + hc, _m_T(cF, cM, b, HAS_M0), mask=mh)


@triton.jit
def _mlstm_gates_fwd_sum_kernel(i, f, cu, summ, T, H, N, NB, NP, si_b, si_t, si_h, sf_b, sf_t, sf_h,
                                BT: tl.constexpr, BH: tl.constexpr, NS: tl.constexpr, VARLEN: tl.constexpr):
    """Parallel forward, first pass, per (flat block, head block): the block's summary in planes of summ
    ([4, blocks, H] float64): the sum of logσ(f), and at the arg-max J of y' = i − F_local (F_local: the
    in-block cumulative sum) i_J, F_local,J and J."""
    p, n, bos, L, start, c0, c1, ar, hc, mh = _program(cu, N, T, H, NB, BT, BH, NS, VARLEN)
    rows = start + ar
    msk = (rows < L)[:, None] & mh[None, :]
    r64 = rows.to(tl.int64)[:, None]
    Fl = _lf_cumsum(_base(f, n, bos, hc, sf_b, sf_t, sf_h, VARLEN), r64 * sf_t, msk)
    x = tl.load(_base(i, n, bos, hc, si_b, si_t, si_h, VARLEN) + r64 * si_t, mask=msk, other=0.0).to(tl.float64)
    y = tl.where(msk, x - Fl, float("-inf"))
    _, J = tl.reduce((y, tl.where(msk, rows[:, None], -1)), 0, _max_arg)
    at = rows[:, None] == J[None, :]
    last = (ar == BT - 1)[:, None]
    po = summ + p.to(tl.int64) * H + hc
    ok = mh & (p < c1)
    tl.store(po, tl.sum(tl.where(last, Fl, 0.0), 0), mask=ok)
    tl.store(po + NP, tl.sum(tl.where(at, x, 0.0), 0), mask=ok)
    tl.store(po + 2 * NP, tl.sum(tl.where(at, Fl, 0.0), 0), mask=ok)
    tl.store(po + 3 * NP, J.to(tl.float64), mask=ok)


@triton.jit
def _fwd_carry(summ, NP, H, hc, mh, c0, c, BH: tl.constexpr, NC: tl.constexpr):
    """The carry (F, max of y, its step) into flat block c from the summaries of its sequence's blocks c0..c−1,
    NC at a time: F before each block is an exclusive prefix sum of the blocks' sums (the same sum for every
    block that needs it), and y at a block's arg-max is recomputed as its own forward computes it,
    i_J − (F_local,J + F before the block)."""
    ar = tl.arange(0, NC)
    cF = tl.zeros([BH], dtype=tl.float64)
    cM = tl.full([BH], float("-inf"), tl.float64)
    cJ = tl.zeros([BH], dtype=tl.int32)
    for k0 in range(c0, c + 1, NC):
        ks = k0 + ar
        kh = ks.to(tl.int64)[:, None] * H + hc[None, :]
        prev = ((ks > c0) & (ks <= c))[:, None] & mh[None, :]
        earlier = (ks < c)[:, None] & mh[None, :]
        Fx = tl.cumsum(tl.load(summ + kh - H, mask=prev, other=0.0), 0) + cF[None, :]  # F before block k
        y = tl.load(summ + NP + kh, mask=earlier, other=0.0) - (tl.load(summ + 2 * NP + kh, mask=earlier,
                                                                       other=0.0) + Fx)
        y = tl.where(earlier, y, float("-inf"))
        j = tl.where(earlier, tl.load(summ + 3 * NP + kh, mask=earlier, other=0.0).to(tl.int32), -1)
        Mk, Jk = tl.reduce((y, j), 0, _max_arg)
        cM, cJ = _max_arg(cM, cJ, Mk, Jk)
        at = (ks == tl.minimum(c, k0 + NC - 1))[:, None]  # F before block c, or the end of the piece
        cF = tl.sum(tl.where(at, Fx, 0.0), 0)
    return cF, cM, cJ


@triton.jit
def _mlstm_gates_fwd_kernel(i, f, m0, cu, summ, ldp, logw, m, mT, code, T, H, N, NB, NP, si_b, si_t, si_h, sf_b,
                            sf_t, sf_h, BT: tl.constexpr, BH: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr,
                            VARLEN: tl.constexpr, HAS_M0: tl.constexpr, SAVE: tl.constexpr):
    """Parallel forward, second pass, per (flat block, head block): the carry from the earlier blocks' summaries,
    then the sequential kernel's block; the sequence's last block writes m_T."""
    p, n, bos, L, start, c0, c1, ar, hc, mh = _program(cu, N, T, H, NB, BT, BH, NS, VARLEN)
    pi = _base(i, n, bos, hc, si_b, si_t, si_h, VARLEN)
    pf = _base(f, n, bos, hc, sf_b, sf_t, sf_h, VARLEN)
    po = (bos * H + hc)[None, :]
    b = _per_head(m0, n, H, hc, mh, HAS_M0, BH)
    cF, cM, cJ = _fwd_carry(summ, NP, H, hc, mh, c0, p, BH, NC)
    cF, cM, cJ = _fwd_block(pi, pf, si_t, sf_t, po, ldp, logw, m, code, H, start, L, ar, mh, b, cF, cM, cJ,
                            BT, BH, HAS_M0, SAVE)
    tl.store(mT + n * H + hc, _m_T(cF, cM, b, HAS_M0), mask=mh & (p == c1 - 1))


@triton.jit
def _bwd_inputs(gm, code, off, msk, rows, L, gT, BT: tl.constexpr, BH: tl.constexpr, HAS_GM: tl.constexpr,
                HAS_GMT: tl.constexpr):
    """A block's G = dm (+ dm_T at the last step), arg-max keys (padded steps: keys above every arg-max), weights'
    codes and x = w G."""
    if HAS_GM:
        G = tl.load(gm + off, mask=msk, other=0.0).to(tl.float64)
    else:
        G = tl.zeros([BT, BH], dtype=tl.float64)
    if HAS_GMT:
        G += tl.where((rows == L - 1)[:, None], gT[None, :], 0.0)
        G = tl.where(msk, G, 0.0)
    c = tl.load(code + off, mask=msk, other=0)
    key = tl.where(msk, c >> 2, rows[:, None])
    wc = c & 3
    x = tl.where(wc == 2, G, tl.where(wc == 1, G * 0.5, 0.0))
    return G, key, wc, x


@triton.jit
def _dm0_terms(G, wc):
    """(1 − w) G: the part of G that reaches m_0 (also Σ G − Σ x over a block)."""
    return tl.where(wc == 2, 0.0, tl.where(wc == 1, G * 0.5, G))


@triton.jit
def _bwd_block(pf, sf_t, po, code, gldp, glogw, gm, di, df, H, start, L, ar, mh, gT, pend, cR,
               BT: tl.constexpr, BH: tl.constexpr, HAS_M0: tl.constexpr, HAS_GLDP: tl.constexpr,
               HAS_GLOGW: tl.constexpr, HAS_GM: tl.constexpr, HAS_GMT: tl.constexpr):
    """The steps [start, start + BT) given the later steps' carry (pend: their x for the arg-max at this block's
    end; cR: their Σ (G − A)): writes di, df; returns the carry out of the block and its Σ (1 − w) G."""
    rows = start + ar
    msk = (rows < L)[:, None] & mh[None, :]
    r64 = rows.to(tl.int64)[:, None]
    off = po + r64 * H
    G, key, wc, x = _bwd_inputs(gm, code, off, msk, rows, L, gT, BT, BH, HAS_GM, HAS_GMT)
    if HAS_M0:
        g0 = tl.sum(_dm0_terms(G, wc), 0)
    else:
        g0 = tl.zeros([BH], dtype=tl.float64)
    x += tl.where((ar == BT - 1)[:, None], pend[None, :], 0.0)
    _, S = tl.associative_scan((key, x), 0, _run_sum, reverse=True)
    A = tl.where((key == rows[:, None]) & msk, S, 0.0)
    first = (ar == 0)[:, None]
    pend = tl.sum(tl.where(first & (key < start), S, 0.0), 0)
    R = tl.cumsum(G - A, 0, reverse=True) + cR[None, :]
    cR = tl.sum(tl.where(first, R, 0.0), 0)
    if HAS_GLDP:
        R += tl.load(gldp + off, mask=msk, other=0.0).to(tl.float64)
    if HAS_GLOGW:
        A += tl.load(glogw + off, mask=msk, other=0.0).to(tl.float64)
    xf = tl.load(pf + r64 * sf_t, mask=msk, other=0.0).to(tl.float64)
    z = tl.exp(-tl.abs(xf))
    s = z / (1.0 + z)
    s = tl.where(xf < 0.0, 1.0 - s, s)  # σ(−f), as torch's logsigmoid backward forms it
    tl.store(df + off, (R * s).to(df.dtype.element_ty), mask=msk)
    tl.store(di + off, A.to(di.dtype.element_ty), mask=msk)
    return pend, cR, g0


@triton.jit
def _mlstm_gates_bwd_seq_kernel(f, code, cu, gldp, glogw, gm, gmT, di, df, dm0, T, H, sf_b, sf_t, sf_h,
                                BT: tl.constexpr, BH: tl.constexpr, VARLEN: tl.constexpr, HAS_M0: tl.constexpr,
                                HAS_GLDP: tl.constexpr, HAS_GLOGW: tl.constexpr, HAS_GM: tl.constexpr,
                                HAS_GMT: tl.constexpr):
    """Sequential backward: one program per (sequence, head block) walks its sequence in reverse."""
    n, i_h = tl.program_id(0), tl.program_id(1)  # sequences on axis 0 (up to 2^31)
    bos, L = _span(n, cu, T, VARLEN)
    ar = tl.arange(0, BT)
    hc = i_h * BH + tl.arange(0, BH)
    mh = hc < H
    pf = _base(f, n, bos, hc, sf_b, sf_t, sf_h, VARLEN)
    po = (bos * H + hc)[None, :]
    gT = _per_head(gmT, n, H, hc, mh, HAS_GMT, BH)
    pend = tl.zeros([BH], dtype=tl.float64)  # gradient of later blocks' steps for the arg-max J at this block's end
    cR = tl.zeros([BH], dtype=tl.float64)  # Σ (G − A) over the later blocks
    g0 = tl.zeros([BH], dtype=tl.float64)
    nb = tl.cdiv(L, BT)
    for jb in range(0, nb):
        pend, cR, g = _bwd_block(pf, sf_t, po, code, gldp, glogw, gm, di, df, H, (nb - 1 - jb) * BT, L, ar, mh,
                                 gT, pend, cR, BT, BH, HAS_M0, HAS_GLDP, HAS_GLOGW, HAS_GM, HAS_GMT)
        g0 += g
    if HAS_M0:
        tl.store(dm0 + n * H + hc, g0.to(dm0.dtype.element_ty), mask=mh)


@triton.jit
def _mlstm_gates_bwd_sum_kernel(code, cu, gm, gmT, summ, T, H, N, NB, NP, BT: tl.constexpr, BH: tl.constexpr,
                                NS: tl.constexpr, VARLEN: tl.constexpr, HAS_GM: tl.constexpr, HAS_GMT: tl.constexpr):
    """Parallel backward, first pass, per (flat block, head block): the block's summary in planes of summ
    ([3, blocks, H] float64): its first step's arg-max kf, P = Σ x over its steps with that arg-max, and
    D = Σ (1 − w) G = Σ G − Σ x."""
    p, n, bos, L, start, c0, c1, ar, hc, mh = _program(cu, N, T, H, NB, BT, BH, NS, VARLEN)
    rows = start + ar
    msk = (rows < L)[:, None] & mh[None, :]
    off = (bos * H + hc)[None, :] + rows.to(tl.int64)[:, None] * H
    G, key, wc, x = _bwd_inputs(gm, code, off, msk, rows, L, _per_head(gmT, n, H, hc, mh, HAS_GMT, BH), BT, BH, HAS_GM,
                                HAS_GMT)
    kf = tl.sum(tl.where((ar == 0)[:, None], key, 0), 0)
    po = summ + p.to(tl.int64) * H + hc
    ok = mh & (p < c1)
    tl.store(po, kf.to(tl.float64), mask=ok)
    tl.store(po + NP, tl.sum(tl.where(key == kf[None, :], x, 0.0), 0), mask=ok)
    tl.store(po + 2 * NP, tl.sum(_dm0_terms(G, wc), 0), mask=ok)


@triton.jit
def _mlstm_gates_bwd_kernel(f, code, cu, summ, gldp, glogw, gm, gmT, di, df, dm0, T, H, N, NB, NP, sf_b, sf_t,
                            sf_h, BT: tl.constexpr, BH: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr,
                            VARLEN: tl.constexpr,
                            HAS_M0: tl.constexpr, HAS_GLDP: tl.constexpr, HAS_GLOGW: tl.constexpr,
                            HAS_GM: tl.constexpr, HAS_GMT: tl.constexpr):
    """Parallel backward, second pass, per (flat block, head block): the carry from the later blocks' summaries
    (pend = E: P of the later blocks whose first step's arg-max is the one at this block's last step, a
    contiguous run of blocks; cR = Σ D over the later blocks + E), then the sequential kernel's block; the
    sequence's first block writes dm_0 (Σ D over all its blocks)."""
    p, n, bos, L, start, c0, c1, ar, hc, mh = _program(cu, N, T, H, NB, BT, BH, NS, VARLEN)
    po = (bos * H + hc)[None, :]
    # the arg-max at this block's last step (a padded one matches no later block: there is none)
    lrow = start + BT - 1
    kl = tl.load(code + po + lrow.to(tl.int64) * H, mask=(lrow < L) & mh[None, :], other=-4) >> 2
    ac = tl.arange(0, NC)
    E = tl.zeros([BH], dtype=tl.float64)
    Dl = tl.zeros([BH], dtype=tl.float64)
    g0 = tl.zeros([BH], dtype=tl.float64)
    for k0 in range(p, c1, NC):
        ks = k0 + ac
        kh = ks.to(tl.int64)[:, None] * H + hc[None, :]
        inb = (ks < c1)[:, None] & mh[None, :]
        later = inb & (ks > p)[:, None]
        kf = tl.load(summ + kh, mask=later, other=-1.0).to(tl.int32)
        E += tl.sum(tl.where(later & (kf == kl), tl.load(summ + NP + kh, mask=later, other=0.0), 0.0), 0)
        D = tl.load(summ + 2 * NP + kh, mask=inb, other=0.0)
        Dl += tl.sum(tl.where(later, D, 0.0), 0)
        if HAS_M0:
            g0 += tl.sum(D, 0)  # this block's and the later ones': the whole sequence's at its first block
    pf = _base(f, n, bos, hc, sf_b, sf_t, sf_h, VARLEN)
    gT = _per_head(gmT, n, H, hc, mh, HAS_GMT, BH)
    _bwd_block(pf, sf_t, po, code, gldp, glogw, gm, di, df, H, start, L, ar, mh, gT, E, Dl + E, BT, BH, HAS_M0,
               HAS_GLDP, HAS_GLOGW, HAS_GM, HAS_GMT)
    if HAS_M0:
        tl.store(dm0 + n * H + hc, g0.to(dm0.dtype.element_ty), mask=mh & (p == c0) & (p < c1))


def _tiles(T, parallel):
    """(BT steps, BH heads, warps, NC summaries read at a time) from tuned("mlstm_gates", ...): a 3-value setting
    keeps the default NC. Sequential (PARALLEL False): the GPU time is the number of blocks times a block's
    latency, so one head per program and long blocks (an H100 trial at B = 2, T = 65536, H = 16 favoured 1024-2048
    steps x 1 head at 8 warps over 128 x 8 heads; its timings were not kept in a results file). Parallel: every
    block is a program: 128 steps x 4 heads at 4 warps, the fastest of 10 tilings on an H100 at B = 2, T = 8192,
    H = 16 (forward 0.022 ms, backward 0.017; 512 x 1 0.033 / 0.026; the sequential kernels 0.075 / 0.063:
    benchmarks/results/gate_tiles_h100_session13.txt). Short sequences take a block that fits them. The interpreter takes short blocks and pieces (its scans run step by
    step in Python), so that tests cross block borders and piece borders."""
    if INTERPRET:
        cfg = tuned("mlstm_gates", (32, 1, 4, 4))
    elif parallel:
        BT = max(64, min(128, 1 << max(T - 1, 0).bit_length()))
        cfg = tuned("mlstm_gates", (BT, 4, 4, 128))
    else:
        BT = max(64, min(2048, 1 << max(T - 1, 0).bit_length()))
        cfg = tuned("mlstm_gates", (BT, 1, 8 if BT >= 1024 else 4, 128))
    return tuple(cfg) + (4 if INTERPRET else 128,) * (4 - len(cfg))


def _plan(x, cu):
    """(B, T, H, N sequences, whether the parallel kernels run, their tiles) of a call on x [B, T, H]."""
    B, T, H = x.shape
    N = B if cu is None else cu.numel() - 1
    par = _parallel(N, H)
    return B, T, H, N, par, _tiles(T, par)


def _forward(i, f, m0, cu, out_dtype, save):
    """The forward kernels: (ld', logw, m, m_T, code), code the backward's per-step record (int32; m where not
    saved)."""
    B, T, H, N, par, (BT, BH, W, NC) = _plan(i, cu)
    dev = i.device
    ldp = alloc((B, T, H), dev, out_dtype)
    logw = alloc((B, T, H), dev, out_dtype)
    m = alloc((B, T, H), dev, torch.float64)
    mT = alloc((N, H), dev, torch.float64)
    # int32 through alloc's float32 (poisoned: NaN bits, a huge code, in tests)
    code = alloc((B, T, H), dev).view(torch.int32) if save else m
    m0_ = m if m0 is None else m0
    cu_ = m if cu is None else cu
    flags = dict(VARLEN=cu is not None, HAS_M0=m0 is not None, SAVE=save)
    if par:
        nf, NB = _grid(B, T, N, BT, cu is not None)
        summ = alloc((4, nf, H), dev, torch.float64)
        launch(_mlstm_gates_fwd_sum_kernel, (nf, cdiv(H, BH)), i, f, cu_, summ, T, H, N, NB, nf * H,
               *i.stride(), *f.stride(), BT=BT, BH=BH, NS=_seq_piece(NC), VARLEN=cu is not None, num_warps=W)
        launch(_mlstm_gates_fwd_kernel, (nf, cdiv(H, BH)), i, f, m0_, cu_, summ, ldp, logw, m, mT, code, T, H, N,
               NB, nf * H, *i.stride(), *f.stride(), BT=BT, BH=BH, NC=NC, NS=_seq_piece(NC), **flags,
               num_warps=W)
    else:
        launch(_mlstm_gates_fwd_seq_kernel, (N, cdiv(H, BH)), i, f, m0_, cu_, ldp, logw, m, mT, code, T, H,
               *i.stride(), *f.stride(), BT=BT, BH=BH, **flags, num_warps=W)
    return ldp, logw, m, mT, code


def _backward(f, code, cu, gldp, glogw, gm, gmT, m0_spec, i_dtype):
    """The backward kernels: (di, df, dm_0 or None); m0_spec (dtype, shape) of m_0, or None."""
    B, T, H, N, par, (BT, BH, W, NC) = _plan(f, cu)
    dev = f.device
    di = alloc((B, T, H), dev, i_dtype)
    df = alloc((B, T, H), dev, f.dtype)
    dm0 = alloc(m0_spec[1], dev, m0_spec[0]) if m0_spec is not None else None
    gs = [g.contiguous() if g is not None else code for g in (gldp, glogw, gm, gmT)]
    cu_ = code if cu is None else cu
    flags = dict(VARLEN=cu is not None, HAS_GM=gm is not None, HAS_GMT=gmT is not None)
    flags2 = dict(HAS_M0=dm0 is not None, HAS_GLDP=gldp is not None, HAS_GLOGW=glogw is not None, **flags)
    dm0_ = di if dm0 is None else dm0
    if par:
        nf, NB = _grid(B, T, N, BT, cu is not None)
        summ = alloc((3, nf, H), dev, torch.float64)
        launch(_mlstm_gates_bwd_sum_kernel, (nf, cdiv(H, BH)), code, cu_, gs[2], gs[3], summ, T, H, N, NB,
               nf * H, BT=BT, BH=BH, NS=_seq_piece(NC), **flags, num_warps=W)
        launch(_mlstm_gates_bwd_kernel, (nf, cdiv(H, BH)), f, code, cu_, summ, *gs, di, df, dm0_, T, H, N, NB,
               nf * H, *f.stride(), BT=BT, BH=BH, NC=NC, NS=_seq_piece(NC), **flags2, num_warps=W)
    else:
        launch(_mlstm_gates_bwd_seq_kernel, (N, cdiv(H, BH)), f, code, cu_, *gs, di, df, dm0_, T, H,
               *f.stride(), BT=BT, BH=BH, **flags2, num_warps=W)
    return di, df, dm0


class _ExpGates(torch.autograd.Function):
    @staticmethod
    def forward(ctx, i, f, m0, cu, out_dtype, grad):
        save = grad and any(ctx.needs_input_grad[:3])  # (needs_input_grad ignores torch.no_grad)
        ldp, logw, m, mT, code = _forward(i, f, m0, cu, out_dtype, save)
        if save:
            ctx.save_for_backward(f, code, cu)
            ctx.m0 = None if m0 is None else (m0.dtype, m0.shape)
            ctx.i_dtype = i.dtype
        ctx.set_materialize_grads(False)
        return ldp, logw, m, mT

    @staticmethod
    @once_differentiable  # kernels' gradients carry no graph: a second derivative raises
    def backward(ctx, gldp, glogw, gm, gmT):
        f, code, cu = ctx.saved_tensors
        di, df, dm0 = _backward(f, code, cu, gldp, glogw, gm, gmT, ctx.m0, ctx.i_dtype)
        need = ctx.needs_input_grad
        return di if need[0] else None, df if need[1] else None, dm0 if need[2] else None, None, None, None


def _dry(i, f, m0, cu, out_dtype, grad):
    """Forward and (with grad) backward launches of one call, for precompile.py's dry run: the gradients the
    mLSTMexp op sends (ld', logw, m; m_T's only with a final state, compiled by its first call if so)."""
    ldp, logw, m, mT, code = _forward(i, f, m0, cu, out_dtype, grad)
    if grad:
        _backward(f, code, cu, ldp, logw, m, None, None if m0 is None else (m0.dtype, m0.shape), i.dtype)


def mlstm_exp_gates(i, f, m0=None, cu_seqlens=None, out_dtype=torch.float64):
    """The gates of mLSTMexp for the core, as `ula.ops.mlstm._exp_gates` computes them (same values up to
    rounding, the same gradients): i, f [B, T, H] (any float dtype, B == 1 with cu_seqlens [N + 1]); m0 [N, H]
    or None. Returns ld', logw [B, T, H] in out_dtype, m [B, T, H] and m_T [N, H] float64."""
    # the core takes cu_seqlens on any device; the kernels read it as a contiguous array
    cu = None if cu_seqlens is None else cu_seqlens.to(i.device).contiguous()
    m0 = None if m0 is None else m0.contiguous()
    if torch.compiler.is_compiling():  # the same kernels as a custom op, opaque to the trace
        from ._mlstm_gate_op import gates_fwd
        return tuple(gates_fwd(i, f, m0, cu, out_dtype)[:4])
    if i.is_cuda:  # a new configuration's four kernels compiled in parallel before its first run
        from ..core.triton.precompile import compile_in_parallel, grad_wanted
        grad = grad_wanted(i, f, m0)
        compile_in_parallel(("mlstm_gates", i, f, m0, cu, out_dtype, grad, _plan(i, cu)[4]), i,
                            lambda: _dry(i, f, m0, cu, out_dtype, grad))
    return _ExpGates.apply(i, f, m0, cu, out_dtype, torch.is_grad_enabled())
