"""A long sequence's segments, walked side by side by the state kernel (state.py, chunk_states: each segment from
zero, the initial state in the one the walk starts in), joined into the states of one walk: a scan over the
segments' final states and total decays gives the state entering each segment, and one kernel adds it to the
segment's borders, times the decay from the segment's entry to each border. The column of ones, the a part's sums
and the decay gradient's border terms are joined the same way."""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .utils import block, cdiv, launch

_JOIN_BLOCK = 2048


class Cells(NamedTuple):
    """The borders of N sequences' NS segments as cells [N, NS, nL] (nL: the most chunks a segment holds): each cell's
    border as a row-chunk b n + c of the state call's [B, H, n] borders (-1 for a cell past its segment's end),
    the step whose decay the walk takes through its chunk (the chunk's last going forward, its first in reverse) and
    the step after the border (forward: the next chunk's first; reverse: the chunk's last), with whether there is
    one; steps within batch row b (the packed row with varlen). Without varlen every segment has nL chunks."""
    chunk: torch.Tensor
    read: torch.Tensor
    after: torch.Tensor
    has_after: torch.Tensor


def cells(layout, B, T, NS, reverse, device):
    """The Cells of a state call's segments (state.py's segments and segment_table cut them)."""
    C, n = layout.C, layout.n
    if not layout.varlen:  # B rows of n chunks of C steps, NS segments of nL = n / NS each
        c = torch.arange(n, device=device)
        chunk = (torch.arange(B, device=device)[:, None] * n + c).view(B, NS, n // NS)
        read = (c * C + (0 if reverse else C - 1)).view(1, NS, -1)
        after = ((c + 1) * C - (1 if reverse else 0)).clamp_max(T - 1).view(1, NS, -1)
        has_after = torch.ones_like(after, dtype=torch.bool)
        if not reverse:
            has_after[:, -1, -1] = False
        return Cells(chunk, read, after, has_after)
    offsets, cu = layout.host
    rows = []
    for i, j, a, b in _segment_chunks(layout, NS):
        for c in range(a, b):
            cs, ce = cu[i] + c * C, min(cu[i] + (c + 1) * C, cu[i + 1])
            rows.append((i, j, c - a, offsets[i] + c, cs if reverse else ce - 1,
                         ce - 1 if reverse else min(ce, T - 1), reverse or ce < cu[i + 1]))
    nL = max([r[2] for r in rows], default=0) + 1
    chunk = torch.full((layout.N, NS, nL), -1, dtype=torch.int64)
    read, after = torch.zeros_like(chunk), torch.zeros_like(chunk)
    has_after = torch.zeros(chunk.shape, dtype=torch.bool)
    if rows:
        t = torch.tensor(rows, dtype=torch.int64)
        at = (t[:, 0], t[:, 1], t[:, 2])
        chunk[at], read[at], after[at], has_after[at] = t[:, 3], t[:, 4], t[:, 5], t[:, 6].bool()
    return Cells(*(x.to(device) for x in (chunk, read, after, has_after)))


def _segment_chunks(layout, NS):
    """(sequence i, segment j, its first chunk, end) within sequence i, for NS segments of each packed sequence:
    segment j of a sequence of c chunks holds chunks j m .. (j + 1) m - 1 of it, m = ceil(c / NS) (the last ones may
    be shorter or empty)."""
    offsets = layout.host[0]
    for i in range(layout.N):
        nch = offsets[i + 1] - offsets[i]
        m = -(-nch // NS)
        for j in range(NS):
            yield i, j, min(j * m, nch), min((j + 1) * m, nch)


def segment_table(layout, NS, reverse, device):
    """The state kernel's rows for NS segments of each packed sequence (varlen; _segment_chunks), int32 [N NS, 6]:
    first step, end, first chunk, sequence, whether the initial state enters it (the walk's first), the sequence's
    end."""
    offsets, cu = layout.host
    C = layout.C
    rows = [(cu[i] + a * C, min(cu[i] + b * C, cu[i + 1]), offsets[i] + a, i, int(j == (NS - 1 if reverse else 0)),
             cu[i + 1]) for i, j, a, b in _segment_chunks(layout, NS)]
    return torch.tensor(rows, dtype=torch.int32).to(device)


@triton.jit
def _segment_border(i, cells, n, nL, NS, S0, H, F, f_b, DB: tl.constexpr):
    """Program i of the join kernels, one per cell l = i % nL of a segment s with an entering state (S0 + the
    program's segment among the NS - 1 such, per sequence x head gh): (the border's index among all [B, H, n] and
    whether the cell holds one, the entering state's row among [N, H, NS - 1], the decays' address in F
    [Ng, H, NS, nL, DB], sequence stride f_b)."""
    c = i % nL
    s = (i // nL) % (NS - 1)
    gh = i // (nL * (NS - 1))
    g, h = gh // H, gh % H
    rc = tl.load(cells + (g.to(tl.int64) * NS + s + S0) * nL + c)
    bord = ((rc // n) * H + h) * n + rc % n
    seg = gh.to(tl.int64) * (NS - 1) + s
    fb = F + g.to(tl.int64) * f_b + ((h * NS + s + S0) * nL + c) * DB
    return bord, rc >= 0, seg, fb


@triton.jit
def _add_entering_kernel(border, E, mult, cells, n, NS, nL, V, KV, S0, H, mult_b, DB: tl.constexpr,
                         HAS_M: tl.constexpr, BLOCK: tl.constexpr):
    """border[cell] += (mult[g, h, s, l] ⊙) E[g, h, s - S0] for the cells l of segments s = S0 .. S0 + NS - 2 (the
    ones with an entering state): border [B, H, n, K V] in its dtype, E [N, H, NS - 1, K V] float32, mult
    [Ng, H, NS, nL, DB] float32 (the decay from the segment's entry to the border, per K feature or one value;
    sequence stride mult_b, 0 when shared), cells int64 [N, NS, nL] (Cells.chunk)."""
    i, j = tl.program_id(0), tl.program_id(1)
    bord, ok, seg, mb = _segment_border(i, cells, n, nL, NS, S0, H, mult, mult_b, DB)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    m = (cols < KV) & ok
    e = tl.load(E + seg * KV + cols, mask=m, other=0.0)
    if HAS_M:
        if DB > 1:
            e *= tl.load(mb + cols // V, mask=m, other=0.0)
        else:
            e *= tl.load(mb, mask=ok, other=0.0)
    ptr = border + bord * KV + cols
    x = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
    tl.store(ptr, (x + e).to(border.dtype.element_ty), mask=m)


_TERMS_BK, _TERMS_BV = 16, 128  # K rows per program; V columns per step of its loop


@triton.jit
def _entering_terms_kernel(P, Pn, E, En, F, X, cells, n, NS, nL, K, V, NVT, S0, H, f_b, DB: tl.constexpr,
                           ONES: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """X[cell, 0, k] += F[g, h, s, l, k] (Σ_v E[g, h, s - S0, k, v] P[cell, k, v] + En Pn) for the cells of the
    segments with an entering state: P the partner borders [B, H, n, K, V], Pn [B, H, n, K], E [N, H, NS - 1, K, V],
    En [N, H, NS - 1, K], F [Ng, H, NS, nL, DB] float32 (the decays; sequence stride f_b), X [B, H, n, NVT, K]."""
    i, j = tl.program_id(0), tl.program_id(1)
    bord, ok, seg, fb = _segment_border(i, cells, n, nL, NS, S0, H, F, f_b, DB)
    kc = j * BK + tl.arange(0, BK)
    mk = (kc < K) & ok
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
        x *= tl.load(fb, mask=ok, other=0.0)
    ptr = X + bord * NVT * K + kc
    tl.store(ptr, tl.load(ptr, mask=mk, other=0.0) + x, mask=mk)


def _at_cells(b, steps, ok, H):
    """b [Bg, T, H, DB] at one step per cell (steps [1 or N, NS, nL], within batch row g of b where Bg > 1), 0 where
    not ok (None: every cell): float32 [Ng, H, NS, nL, DB]."""
    if b.shape[0] > 1:  # without varlen, rows of their own (every row's cells at the same steps)
        t = b[torch.arange(b.shape[0], device=b.device)[:, None, None], steps[0]].float()
    else:
        t = b[0][steps].float()
    if ok is not None:
        t = torch.where(ok.unsqueeze(-1).unsqueeze(-1), t, 0.0)
    return t.permute(0, 3, 1, 2, 4)


def _add_at_cells(x, index, vals, ok):
    """x[index] += vals where ok (index: a tuple of index tensors; cells past a segment's end at row 0, adding 0)."""
    vals = torch.where(ok.view(*ok.shape, *[1] * (vals.dim() - ok.dim())), vals, 0.0)
    x.index_put_(index, vals.to(x.dtype), accumulate=True)


def join_segments(b, reverse, NS, layout, T, border, final, n_border, n_final, z_carry, z_final,
                  terms=(None, None, None)):
    """The states of NS segments per sequence, each walked from zero (the initial state in the one the walk starts
    from), joined: the state E_s entering segment s from the walk's earlier segments (a scan over their final states
    and total decays) is added to its borders, times the decay from the segment's entry to each border. Borders and
    the column of ones in place; returns the joined final states (final, n_final, z_final). terms = (partner,
    partner_n, X): the decay gradient's border terms X, formed by the kernel from each segment's own states, get the
    entering state's share, E ⊙ partner summed over V (and its column of ones), times the decay to the border and that
    of the step after it."""
    B, H, n = border.shape[:3]
    cl = cells(layout, B, T, NS, reverse, border.device)
    G, nL = cl.chunk.shape[0], cl.chunk.shape[2]
    ok = cl.chunk >= 0
    seg = lambda x: None if x is None else x.view(G, NS, *x.shape[1:])  # noqa: E731  [N * NS, ..] -> [N, NS, ..]
    final, n_final, z_final = seg(final), seg(n_final), seg(z_final)
    mult = D = None
    if b is not None:  # the log decay each chunk puts on the state walking through it: b at the step the kernel reads
        inc = _at_cells(b, cl.read, ok if layout.varlen else None, H).cumsum(3)
        tot = inc[:, :, :, -1:]
        # from the segment's entry to each border: forward through the chunk itself, in reverse up to it
        mult = (tot - inc if reverse else inc).exp().unsqueeze(-1)  # [Ng, H, NS, nL, DB, 1]
        D = tot.squeeze(3).exp()  # [Ng, H, NS, DB]
    E, En, Ez = [None] * NS, [None] * NS, [None] * NS  # entering each segment (None: zero, the first walked)
    join = lambda x, e, f: x if e is None else x + (e if f is None else f * e)  # noqa: E731

    def leaving(j):  # the joined states leaving segment j: its own, plus the entering ones decayed through it
        d = None if D is None else D[:, :, j]  # [Ng, H, DB]
        return (join(final[:, j], E[j], None if d is None else d.unsqueeze(-1)),
                None if n_final is None else join(n_final[:, j], En[j], d),
                None if z_final is None else join(z_final[:, j], Ez[j], None))

    order = list(range(NS - 1, -1, -1) if reverse else range(NS))
    for prev, j in zip(order, order[1:]):
        E[j], En[j], Ez[j] = leaving(prev)
    out_final, out_n, out_z = leaving(order[-1])  # the walk's last segment: the joined final states leave it
    sl = slice(0, NS - 1) if reverse else slice(1, NS)  # the segments with an entering state
    Es = torch.stack(E[sl], 2)  # [N, H, NS - 1, K, V]
    # one kernel: PyTorch's broadcast add on this strided view ran at ~0.8 TB/s on an H100
    V, KV = Es.shape[-1], Es.shape[-1] * Es.shape[-2]
    mk = None if mult is None else mult.squeeze(-1).contiguous()  # [Ng, H, NS, nL, DB]
    launch(_add_entering_kernel, (G * H * (NS - 1) * nL, cdiv(KV, _JOIN_BLOCK)), border, Es,
           Es if mk is None else mk, cl.chunk, n, NS, nL, V, KV, int(not reverse), H,
           mk.stride(0) if mk is not None and mk.shape[0] > 1 else 0,
           DB=1 if mk is None else mk.shape[-1], HAS_M=mk is not None, BLOCK=_JOIN_BLOCK, num_warps=4)
    Ens = None
    rows, okl = cl.chunk[:, sl], ok[:, sl]  # [N, NS - 1, nL]
    if n_border is not None:  # [B, H, n, K]
        Ens = torch.stack(En[sl], 1)  # [N, NS - 1, H, K]
        add = Ens.unsqueeze(2)  # [N, NS - 1, 1, H, K]
        if mult is not None:  # [Ng, H, NS - 1, nL, 1] -> [Ng, NS - 1, nL, H, 1]
            add = add * mult[:, :, sl, :, :, 0].permute(0, 2, 3, 1, 4)
        r = rows.clamp_min(0).unsqueeze(-1)  # [N, NS - 1, nL, 1] against the heads [H]
        _add_at_cells(n_border, (r // n, torch.arange(H, device=r.device), r % n),
                      add.expand(*rows.shape, H, add.shape[-1]), okl)
        Ens = Ens.transpose(1, 2).contiguous()  # [N, H, NS - 1, K], the terms kernel's
    partner, partner_n, X = terms
    if X is not None:  # left decays only (a right decay is not split)
        lam = _at_cells(b, cl.after, ok & cl.has_after, H)  # the step after each border (0: none)
        f = (mult.squeeze(-1) * lam.exp()).contiguous()
        K = Es.shape[-2]
        launch(_entering_terms_kernel, (G * H * (NS - 1) * nL, cdiv(K, _TERMS_BK)), partner,
               partner if partner_n is None else partner_n, Es, Es if Ens is None else Ens, f, X, cl.chunk, n, NS,
               nL, K, V, X.shape[3], int(not reverse), H, f.stride(0) if f.shape[0] > 1 else 0, DB=f.shape[-1],
               ONES=n_border is not None, BK=_TERMS_BK, BV=block(V, _TERMS_BV), num_warps=4)
    if z_carry is not None:  # [B * n, H, V], the vector entering each chunk (no decay)
        Ezs = torch.stack(Ez[sl], 1).unsqueeze(2)  # [N, NS - 1, 1, H, V]
        _add_at_cells(z_carry, (rows.clamp_min(0),), Ezs.expand(*rows.shape, *Ezs.shape[-2:]), okl)
    return out_final, out_n, out_z
