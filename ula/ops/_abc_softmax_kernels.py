"""ABC's cumulative softmax (ula/ops/gsa.py `_cumulative_softmax`) as Triton kernels, one launch each way.

Per sequence, head and slot, along time t, from the slot logits w and the initial log-normalizer z0 (or none):

    z_t = log(exp(z0) + Σ_{j<=t} exp(w_j)),   φ_t = exp(w_t − z_t),   z_T at the sequence's last step.

The PyTorch form takes a float64 logcumsumexp, because float32's spacing at |w| ~ 1e4 (~1e-3) would blur w − z. Here
z is never formed: the scan carries pairs (M, S), M the running max of the logits and S = Σ exp(w_j − M) (the
logsumexp's combine), so φ_t = exp(w_t − M_t) / S_t with w_t − M_t a difference of two logits (exact where they are
within a factor of 2) and S_t in [1, t + 1]: float32 is enough. One program walks a (sequence, head, block of slots)
in blocks of BT steps, with tl.associative_scan in the block and the pair carried between blocks. The forward writes
φ (float32), z_T and, for the backward, the pair entering each block.

Backward, with u_t = φ_t dφ_t less dz_T at the last step, and z_j − z_t <= 0 for t >= j:

    dw_j = φ_j dφ_j − φ_j A_j,   A_j = Σ_{t>=j} u_t exp(z_j − z_t) = u_j + b_j A_{j+1},   b_j = exp(z_j − z_{j+1}),
    dz0 = −exp(z0 − z_first) A_first.

b_j <= 1, so the reverse recurrence is stable at any spread of the logits; z_j − z_{j+1} is formed from the pairs as
(M_j − M_{j+1}) + log(S_j / S_{j+1}), without z's rounding. The backward walks the blocks in reverse: it recomputes
each block's pairs from its entering pair, and the pairs one step ahead from the block shifted by one step, flips the
block's (b, u) (tl.flip) and scans them forward as affine maps, with A carried back between blocks."""
import torch
import triton
import triton.language as tl

from ..core.triton.utils import INTERPRET, alloc, cdiv, launch, tuned
from ._mlstm_gate_kernels import _span

_NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _lse_pair(m1, s1, m2, s2):
    """(max, Σ exp(· − max)) of two runs: the logsumexp's combine, associative and commutative; (−inf, 0) is
    neutral."""
    m = tl.maximum(m1, m2)
    ref = tl.where(m == _NEG_INF, 0.0, m)
    return m, s1 * tl.exp(m1 - ref) + s2 * tl.exp(m2 - ref)


@triton.jit
def _after(w, pos, ok, hm, H, M, cm, cs):
    """The pairs (M_t, S_t) of the steps at positions pos (rows of the block; ok: inside the sequence) following the
    carry (cm, cs), and the logits there (float32, −inf outside)."""
    x = tl.load(w + (pos[:, None] * H) * M + hm, mask=ok, other=float("-inf")).to(tl.float32)
    pm, ps = tl.associative_scan((x, tl.where(ok, 1.0, 0.0)), 0, _lse_pair)
    m, s = _lse_pair(cm[None, :], cs[None, :], pm, ps)
    return x, m, s


@triton.jit
def _first_row(x, rows):
    """x's first row of the block, [BM]."""
    return tl.sum(tl.where(rows[:, None] == 0, x, 0.0), axis=0)


@triton.jit
def _affine(a1, b1, a2, b2):
    """Two steps of A = b + a A_next, the first later in time (the scan runs backwards in time)."""
    return a2 * a1, b2 + a2 * b1


@triton.jit
def _abc_softmax_fwd_kernel(w, z0, cu, phi, zT, carry, T, H, M, BT: tl.constexpr, BM: tl.constexpr,
                            HAS_Z0: tl.constexpr, VARLEN: tl.constexpr, SAVE: tl.constexpr):
    n, h, mb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, L = _span(n, cu, T, VARLEN)
    cols = mb * BM + tl.arange(0, BM)
    cok = cols < M
    rows = tl.arange(0, BT)
    hm = h * M + cols[None, :]
    if HAS_Z0:
        cm = tl.load(z0 + (n * H + h) * M + cols, mask=cok, other=0.0).to(tl.float32)
        cs = tl.where(cok, 1.0, 0.0)
    else:
        cm = tl.full((BM,), float("-inf"), tl.float32)
        cs = tl.zeros((BM,), tl.float32)
    slot = bos // BT + n  # this sequence's first block in `carry` (unique: see _carry_rows)
    for start in range(0, L, BT):
        if SAVE:
            c = carry + ((2 * (slot + start // BT)) * H + h) * M + cols
            tl.store(c, cm, mask=cok)
            tl.store(c + H * M, cs, mask=cok)
        ok = ((start + rows) < L)[:, None] & cok[None, :]
        pos = bos + start + rows
        x, m, s = _after(w, pos, ok, hm, H, M, cm, cs)
        tl.store(phi + (pos[:, None] * H) * M + hm, tl.exp(x - m) / s, mask=ok)
        tm, ts = tl.reduce((x, tl.where(ok, 1.0, 0.0)), 0, _lse_pair)
        cm, cs = _lse_pair(cm, cs, tm, ts)
    tl.store(zT + (n * H + h) * M + cols, cm + tl.log(cs), mask=cok)


@triton.jit
def _abc_softmax_bwd_kernel(w, z0, cu, carry, gphi, gzT, dw, dz0, T, H, M, BT: tl.constexpr, BM: tl.constexpr,
                            HAS_Z0: tl.constexpr, HAS_GZT: tl.constexpr, VARLEN: tl.constexpr):
    n, h, mb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, L = _span(n, cu, T, VARLEN)
    cols = mb * BM + tl.arange(0, BM)
    cok = cols < M
    rows = tl.arange(0, BT)
    hm = h * M + cols[None, :]
    slot = bos // BT + n
    gz = tl.zeros((BM,), tl.float32)
    if HAS_GZT:
        gz = tl.load(gzT + (n * H + h) * M + cols, mask=cok, other=0.0).to(tl.float32)
    A_next = tl.zeros((BM,), tl.float32)
    nb = (L + BT - 1) // BT
    for i in range(0, nb):
        start = (nb - 1 - i) * BT
        c = carry + ((2 * (slot + start // BT)) * H + h) * M + cols
        cm = tl.load(c, mask=cok, other=0.0)
        cs = tl.load(c + H * M, mask=cok, other=0.0)
        ok = ((start + rows) < L)[:, None] & cok[None, :]
        pos = bos + start + rows
        x, m, s = _after(w, pos, ok, hm, H, M, cm, cs)
        # the pairs one step ahead: the block shifted by one step, after the pair of its first step
        ok1 = ((start + rows + 1) < L)[:, None] & cok[None, :]
        _, m1, s1 = _after(w, pos + 1, ok1, hm, H, M, _first_row(m, rows), _first_row(s, rows))
        ph = tl.where(ok, tl.exp(x - m) / s, 0.0)
        g = tl.load(gphi + (pos[:, None] * H) * M + hm, mask=ok, other=0.0).to(tl.float32)
        u = ph * g - tl.where(((start + rows) == L - 1)[:, None], gz[None, :], 0.0)
        b = tl.where(ok1, tl.exp((m - m1) + tl.log(s / s1)), 0.0)  # (past the end: A_next is 0 there)
        a_r, c_r = tl.associative_scan((tl.flip(b, 0), tl.flip(u, 0)), 0, _affine)
        A = tl.flip(c_r + a_r * A_next[None, :], 0)
        tl.store(dw + (pos[:, None] * H) * M + hm, ph * g - ph * A, mask=ok)
        A_next = _first_row(A, rows)
        if HAS_Z0:
            if start == 0:
                zf = tl.where(cok, _first_row(m, rows) + tl.log(_first_row(s, rows)), 0.0)  # (slots past m: 0)
                zz = tl.load(z0 + (n * H + h) * M + cols, mask=cok, other=0.0).to(tl.float32)
                tl.store(dz0 + (n * H + h) * M + cols, -tl.exp(zz - zf) * A_next, mask=cok)
    if HAS_Z0:
        if nb == 0:  # an empty sequence: z_T = z0
            tl.store(dz0 + (n * H + h) * M + cols, gz, mask=cok)


def _tiles():
    """(BT steps, BM slots, warps). The interpreter takes short blocks and few slots, so tests cross both."""
    return tuned("abc_softmax", (8, 4, 1) if INTERPRET else (64, 16, 4))


def _carry_rows(T, N, BT):
    """Rows of the carry buffer: sequence n's blocks take rows bos // BT + n onwards, unique because a sequence of
    L steps has cdiv(L, BT) <= (bos + L) // BT − bos // BT + 1 blocks; at most T // BT + N + 1 rows in all."""
    return T // BT + N + 1


def forward(w, z0, cu, save):
    """(φ [B, T, H, m] float32, z_T [N, H, m] float32, the carry buffer or None) of w [B, T, H, m] (B == 1 with cu)."""
    B, T, H, M = w.shape
    N = B if cu is None else cu.numel() - 1
    BT, BM, W = _tiles()
    w = w.contiguous()
    phi = alloc((B, T, H, M), w.device)
    zT = alloc((N, H, M), w.device)
    carry = alloc((_carry_rows(B * T, N, BT), 2, H, M), w.device) if save else zT
    launch(_abc_softmax_fwd_kernel, (N, H, cdiv(M, BM)), w, zT if z0 is None else z0.contiguous(),
           zT if cu is None else cu, phi, zT, carry, T, H, M, BT=BT, BM=BM, HAS_Z0=z0 is not None,
           VARLEN=cu is not None, SAVE=save, num_warps=W)
    return phi, zT, (carry if save else None)


def backward(w, z0, cu, carry, gphi, gzT):
    """(dw in w's dtype, dz0 float32 or None) from dφ (any float dtype, or None: zeros) and dz_T (or None)."""
    B, T, H, M = w.shape
    N = B if cu is None else cu.numel() - 1
    BT, BM, W = _tiles()
    w = w.contiguous()
    gphi = torch.zeros_like(w, dtype=torch.float32) if gphi is None else gphi.contiguous()
    dw = alloc((B, T, H, M), w.device, w.dtype)
    dz0 = alloc((N, H, M), w.device) if z0 is not None else None
    launch(_abc_softmax_bwd_kernel, (N, H, cdiv(M, BM)), w, carry if z0 is None else z0.contiguous(),
           carry if cu is None else cu, carry, gphi, carry if gzT is None else gzT.contiguous(), dw,
           carry if dz0 is None else dz0, T, H, M, BT=BT, BM=BM, HAS_Z0=z0 is not None, HAS_GZT=gzT is not None,
           VARLEN=cu is not None, num_warps=W)
    return dw, dz0
