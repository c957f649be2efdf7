"""A long sequence split along T into segments on one GPU: context parallelism's algorithm (context_parallel.py)
with the segments as batch rows instead of ranks.

The state kernel walks each sequence's chunks in turn, one program per (batch row, head, K tile, V tile). With few
of those (B·H small) and a long T, most multiprocessors idle while a few walk hundreds of chunks. Split into S
segments of L = T / S steps, the core runs on [B·S, L, ...] (S times the programs, 1/S of the walk each) from zero
states, then, as in context parallelism,

    E_j = D_j ⊙ E_{j-1} + X_j       (X_j: segment j's final state from zero, D_j = exp(its total log decay))
    o_t += scale · E_{j-1}ᵀ (exp(b_t) ⊙ q_t)    for t in segment j > 0, b_t the log decay summed from its start

the second by the entry kernels of ula/core/triton/entry.py, in place. Backward: the core's own, run from the
entering states (op.BackwardInitialState), forms every gradient of both terms but the states' (the sum is one core
call from E); the entry term's dE kernel forms those, and autograd carries them through the scan.

Inside a context-parallel slice (context_parallel.py) the segments' backward initial states also take the slice's
entering state, decayed to each segment's start (_EnteringRows), so a rank's local pass splits as one GPU's call does.

Taken on the Triton backend in eager training calls with a left decay (key gate allowed), forward direction, no
right decay, no cu_seqlens, T a multiple of S chunks; `segments` picks S. Without a decay, and with one where it
makes 4 segments or more, the state kernel splits its own walk instead (ula/core/triton/state.py, segments).
ULA_TIME_SPLIT=S sets S for every such call, with a decay or none (1: never split), for measurements."""
import os

import torch

from .autograd import canonical_left
from .backends import runs_triton
from . import op as _op
from .op import BackwardInitialState, backward_initial_state, padded_state, run

_FORCED = os.environ.get("ULA_TIME_SPLIT")
# The shortest segment split off: on an H100 at B1 T8192 H16 (two segments of 4096) the decays lost up to 17%
# (constant), while segments of 8192 steps and more gained for every kind but constant decay at B1 T32768 H16 (+1%)
# (benchmarks/results/time_split_auto_h100_session28.json, time_split_kept_h100_session28.json).
MIN_SEGMENT = 8192


def segments(q, v, ld, rd, cu_seqlens, reverse, backend, chunk_size, needs_grad=True):
    """How many segments a call is split into (1: none); see the module docstring for the calls it applies to.

    The choice: double S while the state kernel's programs at its default tiles times S stay within the
    multiprocessors and segments keep MIN_SEGMENT steps. Forward+backward, bf16, K=V=128, on an H100, this choice
    against no split in the same call (benchmarks/results/time_split_kept_h100_session28.json): B1 H16 (64 programs,
    S = 2) at T = 32768 / 65536, constant +1% / -2%, scalar -5% / -5%, vector -9% / -11%; B1 H8 T16384 (32
    programs, S = 2) -8%, -9%, -17% (no decay: -17% / -17% / -25% here, now the state kernel's split's). At B2 H16
    (128 programs) every kind was slower split (time_split_h200_session28.json): no split. A forward alone with a
    decay gains nothing (the entry term costs what the state call saves). Without a decay the state kernel's own split
    (ula/core/triton/state.py, segments) serves every call, forward alone too: this one takes calls with a decay and
    gradients only, and of those only where the state kernel would not split them itself (it does at 4 segments or
    more, and was 1-11% faster there: benchmarks/results/state_split_choice_h200_session30.json)."""
    B, T, H, K = q.shape
    # K > 256: the entry kernels' limit; a decay per feature over 256 features runs as calls of 256 (op.py), which a
    # split's entering state cannot take
    wide = K > 256 or _op._wide_decay(q, v, ld, None, backend)
    if (rd is not None or cu_seqlens is not None or reverse or wide or q.dtype == torch.float64
            or torch.compiler.is_compiling() or not runs_triton(backend, q.device)):
        return 1
    from .triton.entry import BT as ENTRY_BT  # segments hold whole chunks of the core's and the entry kernels'
    step = max(int(chunk_size), ENTRY_BT)
    if _FORCED is not None:
        S = int(_FORCED)
        return S if S > 1 and T % (S * step) == 0 else 1
    from .triton.state import segment_count, split_count
    # without a decay the state kernel splits its own walks (state.segments): faster than this split there on an H100
    # (B1 H16 T32768 f+b 1.754 against 1.795 ms, B1 H8 T16384 0.499 against 0.595; state_split_h100_session29.json);
    # a forward alone with a decay gains nothing (below)
    if ld is None or not needs_grad:
        return 1
    # where the state kernel splits a decayed call's walks itself (4 segments or more: few heads), it beat this split
    # by 2-5% on an H100 (B1 H8 T16384, scalar / vector / mLSTMsig / GLA; state_split_decays_terms_h100_session29.json)
    if segment_count(B, T, H, K, v.shape[-1], int(chunk_size), True, q.device) > 1:
        return 1
    return split_count(B, T, H, K, v.shape[-1], step, MIN_SEGMENT, q.device)


class _EntryTerms(torch.autograd.Function):
    """o [B * S, L, H, V] (the core's output, segments as rows) plus each later segment's entry term, in place (on
    the core's own tensor, not a view: autograd would copy it whole for a view written in place); its backward forms
    the entering states' gradients alone (q and the decays come detached: the core's backward forms theirs)."""

    @staticmethod
    def forward(ctx, o, q, gl, E, carries, scale, S):
        from .triton.entry import entry_forward
        B, T = q.shape[:2]
        L = T // S
        q5, o5 = q.view(B, S, L, *q.shape[2:]), o.view(B, S, L, *o.shape[2:])
        for j in range(1, S):
            g = None if gl is None else gl[:, j * L:(j + 1) * L]
            entry_forward(q5[:, j], g, E[:, j].contiguous(), o5[:, j], scale, carries[j - 1], out=o5[:, j])
        ctx.mark_dirty(o)
        ctx.save_for_backward(q, gl, E, *(c for c in carries if c is not None))
        ctx.cfg = (scale, S)
        return o

    @staticmethod
    def backward(ctx, do):
        from .triton.entry import entry_backward_e
        q, gl, E, *carries = ctx.saved_tensors
        scale, S = ctx.cfg
        B, T = q.shape[:2]
        L = T // S
        # the kernels read rows of unit stride (a loss o.sum() hands back an expanded tensor: every stride 0)
        do = do.contiguous()
        q5, do5 = q.view(B, S, L, *q.shape[2:]), do.view(B, S, L, *do.shape[2:])
        dE = torch.zeros_like(E)
        for j in range(1, S):
            g = None if gl is None else gl[:, j * L:(j + 1) * L]
            dE[:, j] = entry_backward_e(q5[:, j], g, E[:, j].contiguous(), do5[:, j], scale,
                                        carries[j - 1] if carries else None, True, False)[0]
        return do, None, None, dE, None, None, None


def _decay_sums(gl, S, L, first):
    """For segments 1 .. S-1 (segment 0 takes no entry term): the entry kernels' carries of each (entry.chunk_carry,
    [Bg, n, H, KG]); and the segments' total log decays [Bg, S', H, KG], S' = S with `first`, else S - 1 (segment 0's
    meets an entering state only inside a context-parallel slice); float32, from one read of those segments' decays."""
    from .triton.entry import chunk_carry
    Bg, T, H, KG = gl.shape
    s0 = 0 if first else 1
    carry, total = chunk_carry(gl[:, s0 * L:].reshape(Bg * (S - s0), L, H, KG), L, with_total=True)
    carry = carry.view(Bg, S - s0, *carry.shape[1:])
    return [carry[:, j].contiguous() for j in range(1 - s0, S - s0)], total.view(Bg, S - s0, H, KG)


class _EnteringRows(BackwardInitialState):
    """The core's backward initial state for each segment row (op.BackwardInitialState): the state entering it from
    the scan, plus, inside a context-parallel slice, the slice's entering state (`outer`'s value, known only once the
    ranks have exchanged their states) decayed to the segment's start (`decay_to` [Bg, S, H, KG, 1], 1 for the
    first; the number 1 without a decay)."""

    def __init__(self, outer):  # no value attribute of its own: it is formed when read, from rows set after the call
        self.outer, self.rows, self.decay_to = outer, None, None

    @property
    def value(self):
        rows = self.rows
        if rows is not None and self.outer is not None and self.outer.value is not None:
            outer = padded_state(self.outer.value, *rows.shape[-2:])  # the slice's widths, maybe unpadded
            rows = rows + self.decay_to * outer.to(rows.dtype).unsqueeze(1)
        return None if rows is None else rows.reshape(-1, *rows.shape[2:])


def split_run(q, k, v, ld, h0, scale, chunk_size, backend, kg, prec, S, needs_grad):
    """(o, final state float32) of the core over S segments of T (module docstring); arguments as op.run's, and
    whether any input wants a gradient."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    L = T // S
    q = q.contiguous()  # its segments are views of it for the entry kernels

    def seg(x):
        return None if x is None else x.reshape(B * S, L, *x.shape[2:])

    outer = _op._NEXT_BOX[0]  # a context-parallel slice's: its entering state joins the segments' (_EnteringRows)
    h0_rows = None
    if h0 is not None:  # each sequence's first segment starts from its initial state, the others from zero
        h0_rows = torch.stack([h0] + [torch.zeros_like(h0)] * (S - 1), 1).reshape(B * S, H, K, V)
    box = _EnteringRows(outer) if needs_grad or outer is not None else None
    with backward_initial_state(box):
        o, X, _ = run(seg(q), seg(k), seg(v), ld if ld is None or ld.dim() == 1 else seg(ld), None, h0_rows, None,
                      scale, False, chunk_size, backend, seg(kg), prec)
    X = X.view(B, S, H, K, V)
    gl = canonical_left(ld, T)
    carries, D, decay_to = [None] * (S - 1), None, 1.0
    if gl is not None:
        gl = gl.detach()  # the core's backward, from the entering states, forms the decay's gradient of D ⊙ E
        carries, tot = _decay_sums(gl, S, L, outer is not None)
        if outer is not None:  # exp of the total log decay before each segment (inclusive sums, shifted)
            before = torch.cat([torch.zeros_like(tot[:, :1]), tot[:, :-1].cumsum(1)], 1)
            decay_to, tot = torch.exp(before).unsqueeze(-1), tot[:, 1:]
        D = torch.exp(tot).unsqueeze(-1)  # [Bg, S - 1, H, KG, 1]: segments 1 .. S-1
    # the scan over the segments
    E_in, E = [torch.zeros_like(X[:, 0]) if h0 is None else h0.detach().to(X.dtype)], X[:, 0]
    for j in range(1, S):
        E_in.append(E)
        E = X[:, j] + (E if D is None else D[:, j - 1] * E)
    E_in = torch.stack(E_in, 1)  # [B, S, H, K, V]
    if box is not None:
        box.rows, box.decay_to = E_in.detach(), decay_to
    o = _EntryTerms.apply(o, q.detach() if box is not None else q, gl, E_in, carries, float(scale), S)
    return o.view(B, T, H, V), E
