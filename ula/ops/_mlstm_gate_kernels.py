"""The mLSTMexp gate scan (ula/ops/mlstm.py: `_exp_gates`) as one Triton kernel forward and one backward.

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

Kernel layout. One program per (sequence, block of BH heads; one head by default, see `_tiles`), walking its
sequence in blocks of BT steps (any length) with a carry: F (the last cumulative sum), and (M⁰, J) of the steps
so far. Within a block, tl.cumsum gives F and one tl.associative_scan gives, per step, the running max with
its arg-max (ties to the later index, NaN above everything: torch.cummax) and the max over the *earlier* steps
(for M_{t−1}: the scan of pairs (max without the last element, max) of a run, which is associative). When a
gradient is needed, the forward writes per step J_t and which of M⁰_t, b gives M_t (int32: 4 J + code, code 2
when M⁰_t > b, 1 on a tie, 0 when b wins; without m_0 the floor 0 is torch's clamp_min: code 2 when M⁰_t >= 0),
which is all the backward needs besides f (sequences up to 2^29 steps).

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

Ties. Ties between M⁰ and m_0 and within the cummax are resolved exactly as the PyTorch code does (later
index; 1/2 each; clamp_min's >=), so the gradients agree on ties too (tested with exact ties, where lf = 0).
The forward sums F in a different order from torch.cumsum, so two y within rounding of each other may rank
differently from the PyTorch code: a set of inputs of measure zero."""
import torch
import triton
import triton.language as tl

from ..core.triton.utils import INTERPRET, alloc, cdiv, launch, tuned


@triton.jit
def _max_scan(e1, v1, j1, e2, v2, j2):
    """Two adjacent runs, the first earlier, each as (max of all but its last step, max, arg-max)."""
    later = (v2 >= v1) | (v2 != v2)  # torch.cummax: the later index on ties, NaN above everything
    return tl.where(e2 > v1, e2, v1), tl.where(later, v2, v1), tl.where(later, j2, j1)


@triton.jit
def _run_sum(k1, x1, k2, x2):
    """(smallest key, sum of the values with it): over a run of nondecreasing keys, the sum of its first key's."""
    k = tl.minimum(k1, k2)
    return k, tl.where(k1 == k, x1, 0.0) + tl.where(k2 == k, x2, 0.0)


@triton.jit
def _span(n, cu, T, VARLEN: tl.constexpr):
    """First row (in [B * T]) and length of sequence n."""
    if VARLEN:
        bos = tl.load(cu + n).to(tl.int64)
        return bos, (tl.load(cu + n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        return n.to(tl.int64) * T, T


@triton.jit
def _log1p_exp_neg_abs(x):
    """log(1 + exp(−|x|)) in float64 (logσ(x) = min(x, 0) − this), log1p by Kahan's (1 + z) correction."""
    z = tl.exp(-tl.abs(x))
    u = 1.0 + z
    return tl.where(u == 1.0, z, tl.log(u) * (z / tl.where(u == 1.0, 1.0, u - 1.0)))


@triton.jit
def _mlstm_gates_fwd_kernel(i, f, m0, cu, ldp, logw, m, mT, code, T, H, si_b, si_t, si_h, sf_b, sf_t, sf_h,
                            BT: tl.constexpr, BH: tl.constexpr, VARLEN: tl.constexpr, HAS_M0: tl.constexpr,
                            SAVE: tl.constexpr):
    n, i_h = tl.program_id(0), tl.program_id(1)  # sequences on axis 0 (up to 2^31)
    bos, L = _span(n, cu, T, VARLEN)
    ar = tl.arange(0, BT)
    hc = i_h * BH + tl.arange(0, BH)
    mh = hc < H
    if VARLEN:  # packed: batch row 0, rows bos.. of it
        pi = i + bos * si_t + hc * si_h
        pf = f + bos * sf_t + hc * sf_h
    else:
        pi = i + n.to(tl.int64) * si_b + hc * si_h
        pf = f + n.to(tl.int64) * sf_b + hc * sf_h
    po = (bos * H + hc)[None, :]
    if HAS_M0:
        b = tl.load(m0 + n * H + hc, mask=mh, other=0.0).to(tl.float64)
    else:
        b = tl.zeros([BH], dtype=tl.float64)
    cF = tl.zeros([BH], dtype=tl.float64)  # F at the last step so far
    cM = tl.full([BH], float("-inf"), tl.float64)  # max of y so far, and its step
    cJ = tl.zeros([BH], dtype=tl.int32)
    for start in range(0, L, BT):
        rows = start + ar
        msk = (rows < L)[:, None] & mh[None, :]
        r64 = rows.to(tl.int64)[:, None]
        x = tl.load(pf + r64 * sf_t, mask=msk, other=0.0).to(tl.float64)
        lf = tl.minimum(x, 0.0) - _log1p_exp_neg_abs(x)
        Fc = tl.cumsum(tl.where(msk, lf, 0.0), 0) + cF[None, :]
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
        cF = tl.sum(tl.where(last, Fc, 0.0), 0)
        cM = tl.sum(tl.where(last, M0, 0.0), 0)
        cJ = tl.sum(tl.where(last, J, 0), 0)
    if HAS_M0:
        MT = tl.where((cM < b) | (b != b), b, cM)
    else:
        MT = tl.where(cM < 0.0, 0.0, cM)
    tl.store(mT + n * H + hc, cF + MT, mask=mh)


@triton.jit
def _mlstm_gates_bwd_kernel(f, code, cu, gldp, glogw, gm, gmT, di, df, dm0, T, H, sf_b, sf_t, sf_h,
                            BT: tl.constexpr, BH: tl.constexpr, VARLEN: tl.constexpr, HAS_M0: tl.constexpr,
                            HAS_GLDP: tl.constexpr, HAS_GLOGW: tl.constexpr, HAS_GM: tl.constexpr,
                            HAS_GMT: tl.constexpr):
    n, i_h = tl.program_id(0), tl.program_id(1)  # sequences on axis 0 (up to 2^31)
    bos, L = _span(n, cu, T, VARLEN)
    ar = tl.arange(0, BT)
    hc = i_h * BH + tl.arange(0, BH)
    mh = hc < H
    if VARLEN:
        pf = f + bos * sf_t + hc * sf_h
    else:
        pf = f + n.to(tl.int64) * sf_b + hc * sf_h
    po = (bos * H + hc)[None, :]
    if HAS_GMT:
        gT = tl.load(gmT + n * H + hc, mask=mh, other=0.0).to(tl.float64)
    pend = tl.zeros([BH], dtype=tl.float64)  # gradient of later blocks' steps for the arg-max J at this block's end
    cR = tl.zeros([BH], dtype=tl.float64)  # Σ (G − A) over the later blocks
    g0 = tl.zeros([BH], dtype=tl.float64)
    nb = tl.cdiv(L, BT)
    for jb in range(0, nb):
        start = (nb - 1 - jb) * BT
        rows = start + ar
        msk = (rows < L)[:, None] & mh[None, :]
        r64 = rows.to(tl.int64)[:, None]
        off = po + r64 * H
        if HAS_GM:
            G = tl.load(gm + off, mask=msk, other=0.0).to(tl.float64)
        else:
            G = tl.zeros([BT, BH], dtype=tl.float64)
        if HAS_GMT:
            G += tl.where((rows == L - 1)[:, None], gT[None, :], 0.0)
            G = tl.where(msk, G, 0.0)
        c = tl.load(code + off, mask=msk, other=0)
        key = tl.where(msk, c >> 2, rows[:, None])  # padded steps: keys above every arg-max
        wc = c & 3
        x = tl.where(wc == 2, G, tl.where(wc == 1, G * 0.5, 0.0))
        if HAS_M0:
            g0 += tl.sum(tl.where(wc == 2, 0.0, tl.where(wc == 1, G * 0.5, G)), 0)
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
    if HAS_M0:
        tl.store(dm0 + n * H + hc, g0.to(dm0.dtype.element_ty), mask=mh)


def _tiles(T):
    """(BT steps, BH heads, warps). The walk along T is sequential, so the GPU time is the number of blocks times
    a block's latency: one head per program and long blocks (an H100 trial at B = 2, T = 65536, H = 16 favoured
    1024-2048 steps x 1 head at 8 warps over 128 x 8 heads; its timings were not kept in a results file).
    Short sequences take a block that fits them. The interpreter takes short blocks (its scans run step by step
    in Python)."""
    if INTERPRET:
        return tuned("mlstm_gates", (32, 1, 4))
    BT = max(64, min(2048, 1 << max(T - 1, 0).bit_length()))
    return tuned("mlstm_gates", (BT, 1, 8 if BT >= 1024 else 4))


class _ExpGates(torch.autograd.Function):
    @staticmethod
    def forward(ctx, i, f, m0, cu, out_dtype, grad):
        B, T, H = i.shape
        N = B if cu is None else cu.numel() - 1
        dev = i.device
        BT, BH, W = _tiles(T)
        save = grad and any(ctx.needs_input_grad[:3])  # (needs_input_grad ignores torch.no_grad)
        ldp = alloc((B, T, H), dev, out_dtype)
        logw = alloc((B, T, H), dev, out_dtype)
        m = alloc((B, T, H), dev, torch.float64)
        mT = alloc((N, H), dev, torch.float64)
        # int32 through alloc's float32 (poisoned: NaN bits, a huge code, in tests)
        code = alloc((B, T, H), dev).view(torch.int32) if save else m
        launch(_mlstm_gates_fwd_kernel, (N, cdiv(H, BH)), i, f, m if m0 is None else m0, m if cu is None else cu,
               ldp, logw, m, mT, code, T, H, *i.stride(), *f.stride(), BT=BT, BH=BH, VARLEN=cu is not None,
               HAS_M0=m0 is not None, SAVE=save, num_warps=W)
        if save:
            ctx.save_for_backward(f, code, cu)
            ctx.m0 = None if m0 is None else (m0.dtype, m0.shape)
            ctx.i_dtype = i.dtype
        ctx.set_materialize_grads(False)
        return ldp, logw, m, mT

    @staticmethod
    def backward(ctx, gldp, glogw, gm, gmT):
        f, code, cu = ctx.saved_tensors
        B, T, H = f.shape
        N = B if cu is None else cu.numel() - 1
        dev = f.device
        BT, BH, W = _tiles(T)
        di = alloc((B, T, H), dev, ctx.i_dtype)
        df = alloc((B, T, H), dev, f.dtype)
        dm0 = alloc(ctx.m0[1], dev, ctx.m0[0]) if ctx.m0 is not None else None
        gs = [g.contiguous() if g is not None else None for g in (gldp, glogw, gm, gmT)]
        launch(_mlstm_gates_bwd_kernel, (N, cdiv(H, BH)), f, code, code if cu is None else cu,
               *[g if g is not None else code for g in gs], di, df, dm0 if dm0 is not None else di, T, H,
               *f.stride(), BT=BT, BH=BH, VARLEN=cu is not None, HAS_M0=dm0 is not None,
               HAS_GLDP=gs[0] is not None, HAS_GLOGW=gs[1] is not None, HAS_GM=gs[2] is not None,
               HAS_GMT=gs[3] is not None, num_warps=W)
        need = ctx.needs_input_grad
        return di if need[0] else None, df if need[1] else None, dm0 if need[2] else None, None, None, None


def mlstm_exp_gates(i, f, m0=None, cu_seqlens=None, out_dtype=torch.float64):
    """The gates of mLSTMexp for the core, as `ula.ops.mlstm._exp_gates` computes them (same values up to
    rounding, the same gradients): i, f [B, T, H] (any float dtype, B == 1 with cu_seqlens [N + 1]); m0 [N, H]
    or None. Returns ld', logw [B, T, H] in out_dtype, m [B, T, H] and m_T [N, H] float64."""
    cu = None if cu_seqlens is None else cu_seqlens.to(i.device)  # the core takes cu_seqlens on any device
    return _ExpGates.apply(i, f, None if m0 is None else m0.contiguous(), cu, out_dtype, torch.is_grad_enabled())
