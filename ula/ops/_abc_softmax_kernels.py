"""ABC's cumulative softmax (ula/ops/gsa.py `_cumulative_softmax`) as Triton kernels, three launches each way.

Per sequence, head and slot, along time t, from the slot logits w and the initial log-normalizer z0 (or none):

    z_t = log(exp(z0) + Σ_{j<=t} exp(w_j)),   φ_t = exp(w_t − z_t),   z_T at the sequence's last step.

The PyTorch form takes a float64 logcumsumexp, because float32's spacing at |w| ~ 1e4 (~1e-3) would blur w − z. Here
z is never formed: the scan carries pairs (M, S), M the running max of the logits and S = Σ exp(w_j − M) (the
logsumexp's combine), so φ_t = exp(w_t − M_t) / S_t with w_t − M_t a difference of two logits (exact where they are
within a factor of 2) and S_t in [1, t + 1]: float32 is enough.

Backward, with u_t = φ_t dφ_t less dz_T at the last step, and z_j − z_t <= 0 for t >= j:

    dw_j = φ_j dφ_j − φ_j A_j,   A_j = Σ_{t>=j} u_t exp(z_j − z_t) = u_j + b_j A_{j+1},
    b_j = exp(z_j − z_{j+1}),   dz0 = −exp(z0 − z_first) A_first.

b_j <= 1, so the reverse recurrence is stable at any spread of the logits. b_j = 1 − φ_{j+1} (z_{j+1} is z_j and
w_{j+1} combined), so the backward reads φ, the forward's output, and forms no pair: its kernels are elementwise but
for one scan of the maps (f+b 0.35 ms against 0.97 when the backward rebuilt the pairs from w, B2 T8192 H16
m = 64, H100: benchmarks/results/pending37_h100_session37_part3.log; φ in float32 is kept instead of w). 1 − φ in
float32 has an absolute error of ~6e-8 where the pairs' b was exact relative to itself: over 3000 steps dw stays
within 1.3e-6 of float64 and dz0 within 8.7e-6 (before: 9.7e-7 and 3.5e-7;
benchmarks/cpu_abc_softmax_precision.txt). dz0's factor exp(z0 − z_first) is σ(z0 − w_first), exact where it is
tiny (z0 far below the first logit). In a block, the recurrence's steps are affine maps A ↦ u + b A, composed by a
forward scan over the block's steps loaded in reverse order.

Blocks of BT steps and BM slots, each a program, numbered flat as mLSTMexp's gate kernels number theirs
(ula/ops/_packed_blocks.py: a packed sequence's blocks are one run, found from cu_seqlens on the device). Three
launches each way. Forward: (1) each block's pair (the first block of a sequence with z0's folded in) and whether
it starts a sequence; (2) a segmented scan of those pairs over all blocks, one program per head and slot
block, NP blocks at a time; (3) each block from the pair entering it: its φ and z_T in a sequence's last
block. Backward: (1) each block's composite map (A at its first step from A after its
last); (2) the maps composed from the end, A at each block's first step;
(3) each block's dw from A after it (and dz0 in a sequence's first block). Every step reads each block's summary
once: linear in T. Two earlier forms, measured on an H100 at B2 T8192 H16 m = 64: one program walking each sequence
(0.76 / 1.68 ms forward / backward; its steps are latency-bound), and each block reading all of its sequence's
earlier (later) blocks' summaries (f+b 1.28 ms at best, quadratic in T); benchmarks/results/
abc_softmax_tiles_h100_session36.txt and abc_two_launch_h100_session36.txt. This form with the backward from the
pairs: f+b 0.97 ms there, and 3.75 at B1 T65536 (benchmarks/results/pending36_h100_session37_part8.log)."""
import torch
import triton
import triton.language as tl

from ..core.triton.utils import INTERPRET, alloc, cdiv, launch, tuned
from ._packed_blocks import _block, _grid, _seq_piece

_NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _lse_pair(m1, s1, m2, s2):
    """(max, Σ exp(· − max)) of two runs: the logsumexp's combine, associative and commutative; (−inf, 0) is
    neutral."""
    m = tl.maximum(m1, m2)
    ref = tl.where(m == _NEG_INF, 0.0, m)
    return m, s1 * tl.exp(m1 - ref) + s2 * tl.exp(m2 - ref)


@triton.jit
def _affine(a1, b1, a2, b2):
    """Two steps of A = b + a A_next, the first later in time (the scans run backwards in time)."""
    return a2 * a1, b2 + a2 * b1


@triton.jit
def _where(p, cu, N, T, NB, H, M, BT: tl.constexpr, BM: tl.constexpr, NS: tl.constexpr, VARLEN: tl.constexpr,
           REV: tl.constexpr):
    """Program p's block: (its steps' rows in [B * T], which of its (step, slot) are inside the sequence, the offset of
    its head and slots, its slots, which are < m, first row of the sequence, its length, its steps in the sequence,
    the flat range [c0, c1) of the sequence's blocks). REV: the block's steps in reverse order (the backward's)."""
    n, bos, L, start, c0, c1 = _block(p, cu, N, T, NB, BT, NS, VARLEN)
    cols = tl.program_id(2) * BM + tl.arange(0, BM)
    cok = cols < M
    steps = start + (BT - 1 - tl.arange(0, BT) if REV else tl.arange(0, BT))
    ok = (steps < L)[:, None] & cok[None, :]
    return n, bos + steps, ok, tl.program_id(1) * M + cols[None, :], cols, cok, L, steps, c0, c1


@triton.jit
def _pairs_after(w, pos, ok, hm, H, M, cm, cs):
    """The logits (float32, −inf outside) at rows pos, and the pairs (M_t, S_t) of those steps after the pair entering
    the block (cm, cs)."""
    x = tl.load(w + (pos[:, None] * H) * M + hm, mask=ok, other=float("-inf")).to(tl.float32)
    pm, ps = tl.associative_scan((x, tl.where(ok, 1.0, 0.0)), 0, _lse_pair)
    m, s = _lse_pair(cm[None, :], cs[None, :], pm, ps)
    return x, m, s


@triton.jit
def _last_row(x, BT: tl.constexpr):
    return tl.sum(tl.where((tl.arange(0, BT) == BT - 1)[:, None], x, tl.zeros_like(x)), axis=0)


@triton.jit
def _row2(buf, p, H, M, cols, ok, other0, other1):
    """The two [m] halves of row p of a [rows, 2, H, m] buffer (this program's head and slots)."""
    c = buf + ((2 * p) * H + tl.program_id(1)) * M + cols
    return tl.load(c, mask=ok, other=other0), tl.load(c + H * M, mask=ok, other=other1)


@triton.jit
def _put2(buf, p, H, M, cols, ok, x0, x1):
    c = buf + ((2 * p) * H + tl.program_id(1)) * M + cols
    tl.store(c, x0, mask=ok)
    tl.store(c + H * M, x1, mask=ok)


@triton.jit
def _seq_row(buf, n, H, M, cols):
    """This program's head and slots in row n of a per-sequence [N, H, m] buffer (z0, z_T and their gradients)."""
    return buf + (n * H + tl.program_id(1)) * M + cols


@triton.jit
def _z0_pair(z0, n, H, M, cols, ok):
    """z0 as a pair (z0, 1), neutral (−inf, 0) where not ok or z0 is −inf."""
    zm = tl.load(_seq_row(z0, n, H, M, cols), mask=ok, other=float("-inf")).to(tl.float32)
    return zm, tl.where(zm == _NEG_INF, 0.0, 1.0)


@triton.jit
def _seg(f1, f2):
    """A segmented scan's flags: an element flagged starts a segment (the scan restarts there)."""
    return f1 | f2, f2 != 0


@triton.jit
def _seg_lse(f1, m1, s1, f2, m2, s2):
    f, restart = _seg(f1, f2)
    m, s = _lse_pair(m1, s1, m2, s2)
    return f, tl.where(restart, m2, m), tl.where(restart, s2, s)


@triton.jit
def _abc_softmax_sum_kernel(w, z0, cu, summ, first, T, H, M, N, NB, BT: tl.constexpr, BM: tl.constexpr,
                            NS: tl.constexpr, HAS_Z0: tl.constexpr, VARLEN: tl.constexpr):
    p = tl.program_id(0)
    n, pos, ok, hm, cols, cok, _, _, c0, c1 = _where(p, cu, N, T, NB, H, M, BT, BM, NS, VARLEN, False)
    x = tl.load(w + (pos[:, None] * H) * M + hm, mask=ok, other=float("-inf")).to(tl.float32)
    tm, ts = tl.reduce((x, tl.where(ok, 1.0, 0.0)), 0, _lse_pair)
    if HAS_Z0:  # a sequence's first block: z0 first
        zm, zs = _z0_pair(z0, n, H, M, cols, cok & (p == c0))
        tm, ts = _lse_pair(zm, zs, tm, ts)
    _put2(summ, p, H, M, cols, cok, tm, ts)
    if (tl.program_id(1) == 0) & (tl.program_id(2) == 0):  # (blocks past the last sequence: c0 = c1 = p)
        tl.store(first + p, (p == c0).to(tl.int32))


@triton.jit
def _abc_softmax_scan_kernel(summ, first, incl, nf, H, M, BM: tl.constexpr, NP: tl.constexpr):
    """The blocks' pairs scanned in order, restarting at each sequence: incl[p] the pair after block p."""
    h = tl.program_id(0)
    cols = tl.program_id(1) * BM + tl.arange(0, BM)
    cok = cols < M
    cf = tl.zeros((1, BM), tl.int32)
    cm = tl.full((1, BM), float("-inf"), tl.float32)
    cs = tl.zeros((1, BM), tl.float32)
    for q0 in range(0, nf, NP):
        q = q0 + tl.arange(0, NP)
        qok = (q < nf)[:, None] & cok[None, :]
        f = tl.load(first + q, mask=q < nf, other=1)[:, None] + tl.zeros((1, BM), tl.int32)
        m = tl.load(summ + ((2 * q[:, None]) * H + h) * M + cols[None, :], mask=qok, other=float("-inf"))
        s = tl.load(summ + ((2 * q[:, None] + 1) * H + h) * M + cols[None, :], mask=qok, other=0.0)
        pf, pm, ps = tl.associative_scan((f, m, s), 0, _seg_lse)
        rf, rm, rs = _seg_lse(cf, cm, cs, pf, pm, ps)
        tl.store(incl + ((2 * q[:, None]) * H + h) * M + cols[None, :], rm, mask=qok)
        tl.store(incl + ((2 * q[:, None] + 1) * H + h) * M + cols[None, :], rs, mask=qok)
        cf = _last_row(rf, NP)[None, :]
        cm = _last_row(rm, NP)[None, :]
        cs = _last_row(rs, NP)[None, :]


@triton.jit
def _abc_softmax_fwd_kernel(w, z0, cu, incl, phi, zT, T, H, M, N, NB, BT: tl.constexpr, BM: tl.constexpr,
                            NS: tl.constexpr, HAS_Z0: tl.constexpr, VARLEN: tl.constexpr):
    p = tl.program_id(0)
    n, pos, ok, hm, cols, cok, L, _, c0, c1 = _where(p, cu, N, T, NB, H, M, BT, BM, NS, VARLEN, False)
    cm, cs = _row2(incl, p - 1, H, M, cols, cok & (p > c0), float("-inf"), 0.0)  # the pair after the block before
    if HAS_Z0:  # a sequence's first block: z0's pair
        zm, zs = _z0_pair(z0, n, H, M, cols, cok)
        cm = tl.where(p == c0, zm, cm)
        cs = tl.where(p == c0, zs, cs)
    live = cok & (p < c1)  # (a packed call's blocks past the last sequence write nothing)
    x, m, s = _pairs_after(w, pos, ok, hm, H, M, cm, cs)
    tl.store(phi + (pos[:, None] * H) * M + hm, tl.exp(x - m) / s, mask=ok)
    em, es = _row2(incl, p, H, M, cols, live, 0.0, 1.0)
    tl.store(_seq_row(zT, n, H, M, cols), em + tl.log(es), mask=live & (p == c1 - 1))


@triton.jit
def _bwd_block(phi, gphi, gzT, n, pos, ok, hm, cols, cok, L, steps, H, M, HAS_GZT: tl.constexpr):
    """The block's φ, dφ and its steps' maps scanned from its end: (φ, dφ, a, c), the steps in reverse order (pos,
    ok, steps from `_where(..., REV=True)`): A_t = c_t + a_t A_next, A_next being A at the step after the block. A
    forward scan over the reversed steps, where the maps' order matters."""
    ph = tl.load(phi + (pos[:, None] * H) * M + hm, mask=ok, other=0.0)
    ok1 = ((steps + 1) < L)[:, None] & cok[None, :]  # φ one step ahead, for b (past the end: b = 0)
    ph1 = tl.load(phi + ((pos[:, None] + 1) * H) * M + hm, mask=ok1, other=1.0)
    g = tl.load(gphi + (pos[:, None] * H) * M + hm, mask=ok, other=0.0).to(tl.float32)
    u = ph * g
    if HAS_GZT:
        gz = tl.load(_seq_row(gzT, n, H, M, cols), mask=cok, other=0.0).to(tl.float32)
        u -= tl.where((steps == L - 1)[:, None], gz[None, :], 0.0)
    a, c = tl.associative_scan((1.0 - ph1, u), 0, _affine)
    return ph, g, a, c


@triton.jit
def _abc_softmax_map_kernel(phi, cu, gphi, gzT, maps, T, H, M, N, NB, BT: tl.constexpr, BM: tl.constexpr,
                            NS: tl.constexpr, HAS_GZT: tl.constexpr, VARLEN: tl.constexpr):
    p = tl.program_id(0)
    n, pos, ok, hm, cols, cok, L, steps, c0, c1 = _where(p, cu, N, T, NB, H, M, BT, BM, NS, VARLEN, True)
    _, _, a, c = _bwd_block(phi, gphi, gzT, n, pos, ok, hm, cols, cok, L, steps, H, M, HAS_GZT)
    _put2(maps, p, H, M, cols, cok, _last_row(a, BT), _last_row(c, BT))  # the map at the block's first step


@triton.jit
def _abc_softmax_rscan_kernel(maps, afirst, nf, H, M, BM: tl.constexpr, NP: tl.constexpr):
    """The blocks' maps composed from the end: afirst[p] = A at block p's first step. No restart is needed at a
    sequence's end: its last step's b is 0 (no later step), so its last block's map drops what follows."""
    h = tl.program_id(0)
    cols = tl.program_id(1) * BM + tl.arange(0, BM)
    cok = cols < M
    ca = tl.full((1, BM), 1.0, tl.float32)
    cc = tl.zeros((1, BM), tl.float32)
    for q0 in range(0, nf, NP):
        q = nf - 1 - q0 - tl.arange(0, NP)  # descending: the scan runs backwards in time
        qok = (q >= 0)[:, None] & cok[None, :]
        a = tl.load(maps + ((2 * q[:, None]) * H + h) * M + cols[None, :], mask=qok, other=1.0)
        c = tl.load(maps + ((2 * q[:, None] + 1) * H + h) * M + cols[None, :], mask=qok, other=0.0)
        pa, pc = tl.associative_scan((a, c), 0, _affine)
        ra, rc = _affine(ca, cc, pa, pc)
        tl.store(afirst + (q[:, None] * H + h) * M + cols[None, :], rc, mask=qok)
        ca = _last_row(ra, NP)[None, :]
        cc = _last_row(rc, NP)[None, :]


@triton.jit
def _abc_softmax_bwd_kernel(phi, w, z0, cu, afirst, gphi, gzT, dw, dz0, T, H, M, N, NB, BT: tl.constexpr,
                            BM: tl.constexpr, NS: tl.constexpr, HAS_Z0: tl.constexpr, HAS_GZT: tl.constexpr,
                            VARLEN: tl.constexpr):
    p = tl.program_id(0)
    n, pos, ok, hm, cols, cok, L, steps, c0, c1 = _where(p, cu, N, T, NB, H, M, BT, BM, NS, VARLEN, True)
    A = tl.load(afirst + ((p + 1) * H + tl.program_id(1)) * M + cols, mask=cok & (p + 1 < c1), other=0.0)
    ph, g, a, c = _bwd_block(phi, gphi, gzT, n, pos, ok, hm, cols, cok, L, steps, H, M, HAS_GZT)
    Ab = c + a * A[None, :]
    tl.store(dw + (pos[:, None] * H) * M + hm, ph * (g - Ab), mask=ok)
    if HAS_Z0:  # dz0 = −exp(z0 − z_first) A_first, exp(z0 − z_first) = σ(z0 − w_first) (not 1 − φ_first: exact
        # where tiny); an empty sequence (one block, L = 0): z_T = z0, dz0 = dz_T. (The block's first step: its last
        # row.)
        first = cok & (L > 0)
        wf = tl.load(_seq_row(w, tl.min(pos, axis=0), H, M, cols), mask=first, other=0.0)  # (row bos of w)
        zz = tl.load(_seq_row(z0, n, H, M, cols), mask=first, other=0.0).to(tl.float32)
        x = zz - wf.to(tl.float32)
        ex = tl.exp(tl.minimum(x, -x))  # exp(−|x|) <= 1
        d = -tl.where(x < 0, ex / (1.0 + ex), 1.0 / (1.0 + ex)) * _last_row(Ab, BT)
        if HAS_GZT:
            gz = tl.load(_seq_row(gzT, n, H, M, cols), mask=cok, other=0.0).to(tl.float32)
            d = tl.where(L == 0, gz, d)
        else:
            d = tl.where(L == 0, 0.0, d)
        tl.store(_seq_row(dz0, n, H, M, cols), d, mask=cok & (p == c0) & (p < c1))


def _tiles():
    """(BT steps, BM slots, warps, NP blocks a scan program reads at a time). The interpreter takes short blocks,
    few slots and short pieces, so that tests cross all three. BT, BM and warps: the fastest f+b of 5 tilings on an
    H100 at B2 T8192 H16 m = 64 of the quadratic form before this one (32 x 16 at 1 warp, 1.28 ms; 64 x 16 at 2
    warps 1.93: benchmarks/results/abc_two_launch_h100_session36.txt), and again of 4 with the scans (0.97 ms; 32 x
    32 at 2 warps 0.98, 64 x 8 1.24: benchmarks/results/pending36_h100_session37_part8.log), and with the backward
    from φ (0.352 ms; 32 x 32 at 2 warps 0.354, 64 x 16 at 2 0.360: pending37_h100_session37_part3.log)."""
    return tuned("abc_softmax", (8, 4, 1, 4) if INTERPRET else (32, 16, 1, 256))


def _plan(w, cu):
    B, T, H, M = w.shape
    N = B if cu is None else cu.numel() - 1
    BT, BM, W, NP = _tiles()
    nf, NB = _grid(B, T, N, BT, cu is not None)
    return B, T, H, M, N, nf, NB, BT, BM, W, NP


def forward(w, z0, cu):
    """(φ [B, T, H, m] float32, z_T [N, H, m] float32) of w [B, T, H, m] (B == 1 with cu)."""
    B, T, H, M, N, nf, NB, BT, BM, W, NP = _plan(w, cu)
    w = w.contiguous()
    z0 = None if z0 is None else z0.contiguous()
    dev = w.device
    phi = alloc((B, T, H, M), dev)
    zT = alloc((N, H, M), dev)
    summ = alloc((nf, 2, H, M), dev)
    incl = alloc((nf, 2, H, M), dev)
    first = alloc((nf,), dev).view(torch.int32)  # (through alloc's float32: poisoned in tests)
    cu_, z0_ = (summ if cu is None else cu), (summ if z0 is None else z0)
    grid = (nf, H, cdiv(M, BM))
    flags = dict(NS=_seq_piece(NP), HAS_Z0=z0 is not None, VARLEN=cu is not None)
    launch(_abc_softmax_sum_kernel, grid, w, z0_, cu_, summ, first, T, H, M, N, NB, BT=BT, BM=BM, **flags,
           num_warps=W)
    launch(_abc_softmax_scan_kernel, (H, cdiv(M, BM)), summ, first, incl, nf, H, M, BM=BM, NP=NP, num_warps=8)
    launch(_abc_softmax_fwd_kernel, grid, w, z0_, cu_, incl, phi, zT, T, H, M, N, NB, BT=BT, BM=BM, **flags,
           num_warps=W)
    return phi, zT


def backward(phi, w, z0, cu, gphi, gzT, w_dtype):
    """(dw in w_dtype, dz0 in z0's dtype or None) from φ (the forward's), dφ (any float dtype, or None: zeros) and
    dz_T (or None); w (its first step per sequence) only with z0."""
    B, T, H, M, N, nf, NB, BT, BM, W, NP = _plan(phi, cu)
    dev = phi.device
    gphi = torch.zeros_like(phi) if gphi is None else gphi.contiguous()
    gzT = None if gzT is None else gzT.contiguous()
    dw = alloc((B, T, H, M), dev, w_dtype)
    dz0 = alloc((N, H, M), dev, z0.dtype) if z0 is not None else None
    maps = alloc((nf, 2, H, M), dev)
    afirst = alloc((nf, H, M), dev)
    cu_, gz_ = (maps if cu is None else cu), (maps if gzT is None else gzT)
    grid = (nf, H, cdiv(M, BM))
    flags = dict(NS=_seq_piece(NP), HAS_GZT=gzT is not None, VARLEN=cu is not None)
    launch(_abc_softmax_map_kernel, grid, phi, cu_, gphi, gz_, maps, T, H, M, N, NB, BT=BT, BM=BM, **flags,
           num_warps=W)
    launch(_abc_softmax_rscan_kernel, (H, cdiv(M, BM)), maps, afirst, nf, H, M, BM=BM, NP=NP, num_warps=8)
    w_, z0_, dz0_ = (maps, maps, maps) if z0 is None else (w.contiguous(), z0.contiguous(), dz0)
    launch(_abc_softmax_bwd_kernel, grid, phi, w_, z0_, cu_, afirst, gphi, gz_, dw, dz0_, T, H, M, N, NB, BT=BT, BM=BM,
           HAS_Z0=z0 is not None, **flags, num_warps=W)
    return dw, dz0
