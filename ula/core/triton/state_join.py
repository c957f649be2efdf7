"""A long sequence's segments, walked side by side by the state kernel (state.py, chunk_states: each segment from
zero, the initial state in the one the walk starts in), joined into the states of one walk: a scan over the
segments' final states and total decays gives the state entering each segment, and one kernel adds it to the
segment's borders, times the decay from the segment's entry to each border. The column of ones, the a part's sums
and the decay gradient's border terms are joined the same way."""
import torch
import triton
import triton.language as tl

from ..time_scan import scan_time
from .utils import block, cdiv, launch

_JOIN_BLOCK = 2048


@triton.jit
def _segment_border(i, nL, NS, S0, H, F, f_b, DB: tl.constexpr):
    """Program i of the join kernels, one per border c = i % nL of a segment s with an entering state (S0 + the
    program's segment among the NS - 1 such, per batch row x head bh): (the border's index among all [B, H, n], the
    entering state's row among [B, H, NS - 1], the decays' address in F [Bg, H, NS, nL, DB], batch stride f_b)."""
    c = i % nL
    s = (i // nL) % (NS - 1)
    bh = i // (nL * (NS - 1))
    bord = bh.to(tl.int64) * NS * nL + (s + S0) * nL + c
    seg = bh.to(tl.int64) * (NS - 1) + s
    fb = F + (bh // H).to(tl.int64) * f_b + (((bh % H) * NS + s + S0) * nL + c) * DB
    return bord, seg, fb


@triton.jit
def _add_entering_kernel(border, E, mult, NS, nL, V, KV, S0, H, mult_b, DB: tl.constexpr, HAS_M: tl.constexpr,
                         BLOCK: tl.constexpr):
    """border[b, h, s nL + c] += (mult[b, h, s, c] ⊙) E[b, h, s - S0] for the segments s = S0 .. S0 + NS - 2 (the
    ones with an entering state) and their chunks c: border [B, H, NS nL, K V] in its dtype, E [B, H, NS - 1, K V]
    float32, mult [Bg, H, NS, nL, DB] float32 (the decay from the segment's entry to the border, per K feature or one
    value; batch stride mult_b, 0 when shared)."""
    i, j = tl.program_id(0), tl.program_id(1)
    bord, seg, mb = _segment_border(i, nL, NS, S0, H, mult, mult_b, DB)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    m = cols < KV
    e = tl.load(E + seg * KV + cols, mask=m, other=0.0)
    if HAS_M:
        if DB > 1:
            e *= tl.load(mb + cols // V, mask=m, other=0.0)
        else:
            e *= tl.load(mb)
    ptr = border + bord * KV + cols
    x = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
    tl.store(ptr, (x + e).to(border.dtype.element_ty), mask=m)


_TERMS_BK, _TERMS_BV = 16, 128  # K rows per program; V columns per step of its loop


@triton.jit
def _entering_terms_kernel(P, Pn, E, En, F, X, NS, nL, K, V, NVT, S0, H, f_b, DB: tl.constexpr, ONES: tl.constexpr,
                           BK: tl.constexpr, BV: tl.constexpr):
    """X[b, h, s nL + c, 0, k] += F[b, h, s, c, k] (Σ_v E[b, h, s - S0, k, v] P[b, h, s nL + c, k, v] + En Pn) for the
    segments with an entering state: P the partner borders [B, H, n, K, V], Pn [B, H, n, K], E [B, H, NS - 1, K, V],
    En [B, H, NS - 1, K], F [Bg, H, NS, nL, DB] float32 (the decays; batch stride f_b), X [B, H, n, NVT, K]."""
    i, j = tl.program_id(0), tl.program_id(1)
    bord, seg, fb = _segment_border(i, nL, NS, S0, H, F, f_b, DB)
    kc = j * BK + tl.arange(0, BK)
    mk = kc < K
    x = tl.zeros([BK], dtype=tl.float32)
    for v0 in range(0, V, BV):
        vc = v0 + tl.arange(0, BV)
        mkv = mk[:, None] & (vc < V)[None, :]
        e = tl.load(E + seg * K * V + kc[:, None] * V + vc[None, :], mask=mkv, other=0.0)
        p = tl.load(P + bord * K * V + kc[:, None] * V + vc[None, :], mask=mkv, other=0.0).to(tl.float32)
        x += tl.sum(e * p, 1)
    if ONES:
        pn = tl.load(Pn + bord * K + kc, mask=mk, other=0.0).to(tl.float32)
        x += tl.load(En + seg * K + kc, mask=mk, other=0.0) * pn
    if DB > 1:
        x *= tl.load(fb + kc, mask=mk, other=0.0)
    else:
        x *= tl.load(fb)
    ptr = X + bord * NVT * K + kc
    tl.store(ptr, tl.load(ptr, mask=mk, other=0.0) + x, mask=mk)


def _per_border(b, rows, NS, nL, H):
    """b at one step per border (rows [n]), float32 [Bg, H, NS, nL, DB]: by segment and border within it."""
    t = b[:, rows].float()
    return t.view(t.shape[0], NS, nL, H, t.shape[-1]).permute(0, 3, 1, 2, 4)


def join_segments(b, reverse, NS, C, border, final, n_border, n_final, z_carry, z_final, terms=(None, None, None)):
    """The states of NS segments per sequence, each walked from zero (the initial state in the one the walk starts
    from), joined: the state E_s entering segment s from the walk's earlier segments (a scan over their final states
    and total decays) is added to its borders, times the decay from the segment's entry to each border. Borders and
    the column of ones in place; returns the joined final states (final, n_final, z_final). terms = (partner,
    partner_n, X): the decay gradient's border terms X, formed by the kernel from each segment's own states, get the
    entering state's share, E ⊙ partner summed over V (and its column of ones), times the decay to the border and that
    of the step after it."""
    B, H, n = border.shape[:3]
    nL = n // NS
    seg = lambda x: None if x is None else x.view(B, NS, *x.shape[1:])  # noqa: E731  [B * NS, ..] -> [B, NS, ..]
    final, n_final, z_final = seg(final), seg(n_final), seg(z_final)
    mult = D = None
    if b is not None:  # the log decay each chunk puts on the state walking through it: b at the step the kernel reads
        inc = _per_border(b, torch.arange(n, device=b.device) * C + (0 if reverse else C - 1), NS, nL, H).cumsum(3)
        tot = inc[:, :, :, -1:]
        # from the segment's entry to each border: forward through the chunk itself, in reverse up to it
        mult = (tot - inc if reverse else inc).exp().unsqueeze(-1)  # [Bg, H, NS, nL, DB, 1]
        D = tot.squeeze(3).exp()  # [Bg, H, NS, DB]
    E, En, Ez = [None] * NS, [None] * NS, [None] * NS  # entering each segment (None: zero, the first walked)
    join = lambda x, e, f: x if e is None else x + (e if f is None else f * e)  # noqa: E731

    def leaving(j):  # the joined states leaving segment j: its own, plus the entering ones decayed through it
        d = None if D is None else D[:, :, j]  # [Bg, H, DB]
        return (join(final[:, j], E[j], None if d is None else d.unsqueeze(-1)),
                None if n_final is None else join(n_final[:, j], En[j], d),
                None if z_final is None else join(z_final[:, j], Ez[j], None))

    order = list(range(NS - 1, -1, -1) if reverse else range(NS))
    for prev, j in zip(order, order[1:]):
        E[j], En[j], Ez[j] = leaving(prev)
    out_final, out_n, out_z = leaving(order[-1])  # the walk's last segment: the joined final states leave it
    sl = slice(0, NS - 1) if reverse else slice(1, NS)  # the segments with an entering state
    Es = torch.stack(E[sl], 2)  # [B, H, NS - 1, K, V]
    # one kernel: PyTorch's broadcast add on this strided view ran at ~0.8 TB/s on an H100
    V, KV = Es.shape[-1], Es.shape[-1] * Es.shape[-2]
    mk = None if mult is None else mult.squeeze(-1).contiguous()  # [Bg, H, NS, nL, DB]
    launch(_add_entering_kernel, (B * H * (NS - 1) * nL, cdiv(KV, _JOIN_BLOCK)), border, Es,
           Es if mk is None else mk, NS, nL, V, KV, int(not reverse), H,
           mk.stride(0) if mk is not None and mk.shape[0] > 1 else 0,
           DB=1 if mk is None else mk.shape[-1], HAS_M=mk is not None, BLOCK=_JOIN_BLOCK, num_warps=4)
    Ens = None
    if n_border is not None:
        Ens = torch.stack(En[sl], 2)  # [B, H, NS - 1, K]
        nv = n_border.view(B, H, NS, nL, -1)[:, :, sl]
        if mult is None:
            nv += Ens.unsqueeze(3)
        else:
            nv.addcmul_(mult[:, :, sl, :, :, 0], Ens.unsqueeze(3))
    partner, partner_n, X = terms
    if X is not None:  # left decays only (a right decay is not split)
        # the step after each border (the next chunk's first going forward, the chunk's last in reverse)
        rows = torch.arange(1, n + 1, device=b.device) * C - (1 if reverse else 0)
        lam = _per_border(b, rows.clamp_max(b.shape[1] - 1), NS, nL, H)
        if not reverse:  # none after the sequence's end
            lam[:, :, -1, -1] = 0.0
        f = (mult.squeeze(-1) * lam.exp()).contiguous()
        K = Es.shape[-2]
        launch(_entering_terms_kernel, (B * H * (NS - 1) * nL, cdiv(K, _TERMS_BK)), partner,
               partner if partner_n is None else partner_n, Es, Es if Ens is None else Ens, f, X, NS, nL, K, V,
               X.shape[3], int(not reverse), H, f.stride(0) if f.shape[0] > 1 else 0, DB=f.shape[-1],
               ONES=n_border is not None, BK=_TERMS_BK, BV=block(V, _TERMS_BV), num_warps=4)
    if z_carry is not None:  # [B * n, H, V], the vector entering each chunk (no decay)
        zv = z_carry.view(B, NS, nL, *z_carry.shape[1:])[:, sl]
        zv += torch.stack(Ez[sl], 1).unsqueeze(2)
    return out_final, out_n, out_z


def add_entering_column(n_border, b, layout, delta):
    """n_border [B, H, n, K] float32 (a forward walk's column after each chunk) plus delta [N, H, K] (more column at
    each sequence's start) times the decay from that start through each chunk, in place: the borders of the same walk
    from an initial column larger by delta. b [Bg, T, H, 1] the chunk-local cumulative log decays (None: none); the
    chunk's decay is b at its last step, as the state kernel takes it."""
    B, H, n, K = n_border.shape
    if layout.varlen:
        rows = delta[layout.chunk_seq.long()].permute(1, 0, 2).unsqueeze(0)  # [1, H, n, K]
    else:
        rows = delta.unsqueeze(2)  # [B, H, 1, K]
    if b is None:
        n_border += rows
        return n_border
    T, C = b.shape[1], layout.C
    if layout.varlen:
        seq_end = layout.cu[1:][layout.chunk_seq.long()]
        last = torch.minimum(layout.chunk_start + C, seq_end).long() - 1
    else:
        last = (torch.arange(n, device=b.device) * C + C - 1).clamp_max(T - 1)
    # [Bg, n, H]: through each chunk, from the row's start (time_scan: an outer dim's scan took 0.09 ms at n = 512,
    # H = 16 on an H200, session 46's trace); float64: packed, the sums of earlier sequences are subtracted below
    inc = scan_time(b[:, last, :, 0].double(), lambda y: y.cumsum(-1))
    if layout.varlen:  # from each sequence's start: less the sum before its first chunk
        first = layout.chunk_offset[:-1].long()[layout.chunk_seq.long()]  # each chunk's sequence's first chunk
        inc = inc - torch.where((first > 0)[None, :, None], inc[:, (first - 1).clamp_min(0)], 0.0)
    n_border.addcmul_(inc.exp().float().permute(0, 2, 1).unsqueeze(-1), rows)
    return n_border
