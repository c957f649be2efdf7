"""Context parallelism: one sequence (or a varlen pack) split along T across the ranks of a process group.

Each rank holds a contiguous slice [s_r, e_r) of the time axis (slices may have different lengths, each
>= 1 token; rank order = group rank order). The recurrence of DESIGN §1 is linear in its state, so over a
slice it is an affine map of the state entering it:

    S_exit = D_r ⊙ S_enter + X_r,      D_r = exp(Σ_slice ld)[:, None] · exp(Σ_slice rd)[None, :]  (K × V)

with X_r the slice's own final state from a zero start. The state entering rank r is the scan of the
earlier ranks' pairs (D, X): E_r = D_r ⊙ E_{r-1} + X_r. This module computes it as follows (all of it is
made of differentiable pieces, so autograd gives the backward, the state gradients flowing to earlier
ranks through the backward of the collective):

1. local pass: ONE call of `linear_attention` on the slice, the crossing sequence started from zero
   (sequences that start inside the slice start from their own initial state). It returns the local
   output o_loc and the local final state of every piece of the slice.
2. one differentiable all-gather of (local final states, total log decays of the slice's entry piece),
   float32. Its backward is a reduce-scatter (NCCL) or an all-reduce of the small stacked gradient
   (gloo has no reduce-scatter).
3. the entering state E_{r-1}: the scan above, a loop of R elementwise steps in float32 that every rank
   runs on the gathered pairs (R is small; no sequential communication).
4. the correction, instead of a second pass: the state E entering a slice adds to each output of the
   crossing piece the term  scale · exp(c_t) ⊙ (Eᵀ (exp(b_t) ⊙ q_t))  with b_t, c_t the cumulative log
   decays from the slice start (inclusive; exclusive from the end when reverse=True). All exponents are
   <= 0: nothing overflows. This costs one [L, K] × [K, V] matmul per head, against the two full core
   passes (and two backward passes) of "zero-start pass for the state, then a real pass from S_in"
   (ula/core/cp_entry.py: its own backward, nothing of the slice's size kept in float32; on the Triton backend
   its own kernels, ula/core/triton/entry.py, which write nothing of the slice's size but the results).
   Backward (eager runs, no right decay): o_loc + the term equals one core call from E, so the local pass's own
   backward runs from E (op.BackwardInitialState) and forms every gradient of both; the term forms only E's,
   first, as the previous rank waits for it (its dq and decay gradients would be a second pass over the slice).

All-gather or a ring of send/recv: benchmarks/cp_collectives_cpu.py measures both communication patterns
on CPU gloo (output beside it). There the ring is faster (e.g. 1 MiB state, 4 ranks: ~8 ms against ~23 ms
for all-gather + the all-reduce gloo needs in the backward, having no reduce-scatter; 2 CPU cores, 4
processes, noisy). The all-gather is kept, deliberately: (1) it is one collective each way where the ring
is R - 1 dependent hops each way, each paying a launch/latency cost (the case that matters on GPUs with
NCCL, where the backward is a reduce-scatter, not measured here); (2) every rank gets every boundary
state, so the replicated final state (varlen: every sequence's) needs no further collective and every
rank's backward runs exactly one collective (no ordering hazards); (3) the communicated states are
B·H·K·V floats per rank, milliseconds at most against the slice's own compute. A ring path is not
implemented.

Varlen: `cu_seqlens` in GLOBAL coordinates, the same tensor on every rank. Only a sequence that crosses
a rank boundary carries state across it; a rank whose whole slice lies inside one sequence passes the
state through (D ⊙ E + X), any other rank restarts the scan at its last piece. reverse=True runs the
scan from the last rank to the first (the entry piece of a slice is then its last piece).

Initial state: `initial_state` ([B, H, K, V], or [N, H, K, V] with cu_seqlens) is used by the ranks on
which a sequence starts (rank 0 without varlen; the last rank with reverse=True); the other ranks may
pass it (ignored rows) or None. Its gradient on a rank covers the rows that rank used (zeros elsewhere):
sum it over the ranks (all-reduce, as for any replicated parameter).

Final state: the same tensor is returned on every rank (the last rank's exit state, or each sequence's
from the rank where it ends). Gradient convention of torch.distributed.nn: the objective is the SUM of
the ranks' losses, so a loss on the replicated final state counts once per rank that puts it in its loss
(put it on one rank only, or divide it by the group size).

Key gate (mLSTM's input gate): passed to each rank's local pass (the kernels apply it as they read k); the entry
term reads no k.

Ops on top: gla and mlstm(variant="sig") pass cp_group through; mlstm(variant="exp") first scans its max
state across the ranks (ula/ops/mlstm.py, `_mlstm_exp_cp`) with the pieces of this module (`agree`, `slice_plans`,
`gather`, `tie`), then calls it with `ones` (values [v, 1], the column implicit in the local pass's kernels),
inside `agreed` (its metadata gather already made: one host wait per call, not two).

Every rank must take part in the backward (backprop through o or the final state): the backward runs
one collective, on every rank. The inputs on all ranks must agree in B, H, K, V, dtype, decay kind,
flags and cu_seqlens; this is checked with one small all-gather of metadata before any other collective,
and a bad input on one rank raises on all ranks (no hang). An op on top runs its own checks inside
`raised_everywhere`, which joins that gather with the error, for the same reason.
"""
import bisect
import contextlib
import hashlib
import threading

import torch
import torch.distributed as dist

from .api import linear_attention
from .checks import check_linear_attention, check_state_dtype
from .cp_entry import add_entry_term
from .cu_cache import host_values
from .ones import linear_attention_with_ones
from .op import BackwardInitialState, backward_initial_state

__all__ = ["cp_linear_attention"]

REQUIRES_GRAD = ("requires grad (whether any input requires grad, initial_state included: an initial_state that "
                 "requires grad goes to every rank)")


class _AllGather(torch.autograd.Function):
    """[n] on each rank -> [R, n] on every rank. Backward: the sum over ranks of their gradients for my row."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, x, group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx, g):
        group = ctx.group
        g = g.contiguous()
        if dist.get_backend(group) == "nccl":
            out = torch.empty_like(g[0])
            dist.reduce_scatter_tensor(out, g.view(-1), group=group)
            return out, None
        g = g.clone()
        dist.all_reduce(g, group=group)
        return g[dist.get_rank(group)], None


class _Tie(torch.autograd.Function):
    """x unchanged; the backward gives `anchor` a zero gradient, so every rank's backward reaches the collective
    that produced `anchor` (a rank whose output does not otherwise depend on other ranks must still run it)."""

    @staticmethod
    def forward(ctx, x, anchor):
        ctx.meta = (anchor.shape, anchor.dtype, anchor.device)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        shape, dtype, device = ctx.meta
        return g, torch.zeros(shape, dtype=dtype, device=device)


def gather(x, group, differentiable):
    """x [n] of every rank of `group` -> [R, n] in rank order; differentiable: through `_AllGather` (the backward
    runs a collective on every rank, so it is differentiable even where x is not, e.g. where only an initial state
    that starts no piece on this rank requires grad), else a plain all-gather."""
    if not differentiable:
        return _gather_plain(x, group)
    return _AllGather.apply(x if x.requires_grad else x.detach().requires_grad_(), group)


def tie(x, anchor):
    """x unchanged, its backward reaching the collective that made `anchor` (see `_Tie`)."""
    return _Tie.apply(x, anchor)


def local_offsets(plan, cu_seqlens):
    """The slice's own cu_seqlens (offsets of its pieces inside the slice) from its plan; None without varlen."""
    if cu_seqlens is None:
        return None
    pieces = plan["pieces"]
    return torch.tensor([a for _, a, _ in pieces] + [pieces[-1][2]], dtype=cu_seqlens.dtype, device=cu_seqlens.device)


def _canonical_left(ld, T):
    """[H] / [B, T, H] / [B, T, H, K] log decay -> broadcastable [B|1, T, H, K|1] (views)."""
    if ld is None or ld.dim() == 4:
        return ld
    if ld.dim() == 1:
        return ld.view(1, 1, -1, 1).expand(1, T, ld.shape[0], 1)
    return ld.unsqueeze(-1)


def _ld_code(ld):
    return 0 if ld is None else {1: 1, 3: 2, 4: 3}.get(ld.dim(), 9)


def check_global_cu(cu_seqlens, B):
    """The global `cu_seqlens` of a context-parallel call (None, or int [N + 1] from 0, strictly increasing, with
    B == 1); returns the number of sequences N (B without cu_seqlens). Its end is checked against the total length
    by `slice_plans`, once the slice lengths are known."""
    if cu_seqlens is None:
        return B
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be an int32 or int64 tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D [N + 1], got shape {tuple(cu_seqlens.shape)}")
    if B != 1:
        raise ValueError(f"cu_seqlens needs the sequences packed along T with B == 1, got B = {B}")
    c = list(host_values(cu_seqlens))
    if c[0] != 0 or any(b <= a for a, b in zip(c, c[1:])):
        raise ValueError(f"cu_seqlens (global, over all ranks' slices) must start at 0 and be strictly "
                         f"increasing, got {c}")
    return len(c) - 1


def cu_hash(cu_seqlens):
    """A number that differs between ranks that pass different global cu_seqlens (compared by `agree`): a 63-bit
    digest of the offsets (a weighted sum collided: [0, 1, 14, 20] and [0, 4, 12, 20] gave the same one)."""
    if cu_seqlens is None:
        return -1
    data = ",".join(map(str, host_values(cu_seqlens))).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def dtype_code(*tensors):
    """The dtypes of `tensors` (None allowed) as one int, compared across ranks by `agree`."""
    code = 0
    for x in tensors:
        code = code * 8 + (0 if x is None else 1 + (_DTYPES.index(x.dtype) if x.dtype in _DTYPES else 6))
    return code


def _local_checks(q, k, v, ld, rd, scale, initial_state, cu_seqlens, chunk_size, backend, key_gate, ones):
    """The input checks of linear_attention on the slice, with the global cu_seqlens / initial_state (with
    `ones`: [S0 | n0], one column more)."""
    check_linear_attention(q, k, v, ld, rd, scale, None, None, chunk_size, backend, key_gate)
    B, T, H, K = q.shape
    V = v.shape[-1] + int(ones)
    N = check_global_cu(cu_seqlens, B)
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != (N, H, K, V):
            got = tuple(initial_state.shape) if isinstance(initial_state, torch.Tensor) else type(initial_state).__name__
            raise ValueError(f"initial_state must be {'[N, H, K, V]' if cu_seqlens is not None else '[B, H, K, V]'}"
                             f" = {(N, H, K, V)}, got {got}")
        check_state_dtype(initial_state, q)
        if initial_state.device != q.device:
            raise TypeError(f"initial_state must be on the device of q ({q.device}), got {initial_state.device}")


def agree(group, err, same, own, device, who):
    """One small all-gather of every rank's check result and metadata, before any other collective, so that a
    bad input on one rank raises on every rank (no hang). err: this rank's check error or None (raised here after
    the gather). same: [(name, int)] that every rank must pass alike; own: [int] per-rank values (e.g. the slice
    length). The lists have the same length on every rank (zeros where err is set).
    Returns the `own` lists of all ranks, in rank order. Every call gathers _META_LEN ints, whatever the lists'
    lengths, so that a rank whose op failed its checks before reaching this call (`raised_everywhere`) can join
    the gather of the ranks that did."""
    vals = [int(err is None)] + [int(x) for _, x in same] + [int(x) for x in own]
    assert len(vals) <= _META_LEN, "agree: more metadata than _META_LEN"
    metas = _gather_ints(vals + [0] * (_META_LEN - len(vals)), group, device)
    if err is not None:
        raise err
    bad = [j for j, m in enumerate(metas) if not m[0]]
    if bad:
        raise ValueError(f"{who}: the inputs of rank(s) {bad} failed their checks (see there)")
    for idx, (name, _) in enumerate(same, start=1):
        got = [m[idx] for m in metas]
        if len(set(got)) != 1:
            raise ValueError(f"{who}: every rank of cp_group must pass the same {name}; got {got} (per rank)")
    return [m[1 + len(same):] for m in metas]


_META_LEN = 24


@contextlib.contextmanager
def raised_everywhere(group, who):
    """Around an op's own input checks before its context-parallel call: a check that fails on this rank is
    raised here after joining the metadata gather (`agree`) that the other ranks of `group` enter, so that they
    raise too instead of waiting for this rank forever. Without a usable group (None, size 1) a plain raise."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if (group is None or not isinstance(group, dist.ProcessGroup) or not dist.is_initialized()
                or dist.get_world_size(group) == 1):
            raise
        nccl = dist.get_backend(group) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        agree(group, e, [], [], device, who)  # raises e


_SIDE = {}  # per CUDA device: the stream of the metadata gather


def _gather_ints(vals, group, device):
    """The int list `vals` of every rank, in rank order. With NCCL on a side stream: the current stream holds the
    local pass (queued before), and a gather behind it would make the host wait for that pass, then leave the GPU
    idle while the host queues what follows; on its own stream the host waits for the gather alone. The stream has
    high priority, so that the gather's kernel takes the next free SM ahead of the queued blocks of the compute
    stream's kernels (mLSTMexp on 2 H200s, T 131072: 13.3-14.5 ms per forward+backward at normal priority, 12.6
    at high; benchmarks/gpu_pending_session45.sh 5)."""
    R = dist.get_world_size(group)
    if device.type != "cuda" or dist.get_backend(group) != "nccl":
        t = torch.tensor(vals, dtype=torch.int64, device=device)
        gathered = [torch.empty_like(t) for _ in range(R)]
        dist.all_gather(gathered, t, group=group)
        return [g.tolist() for g in gathered]
    side = _SIDE.get(device)
    if side is None:
        side = _SIDE[device] = torch.cuda.Stream(device, priority=-1)
    src = torch.tensor(vals, dtype=torch.int64).pin_memory()
    back = torch.empty(R * len(vals), dtype=torch.int64).pin_memory()
    with torch.cuda.stream(side):
        out = torch.empty(R * len(vals), dtype=torch.int64, device=device)
        dist.all_gather_into_tensor(out, src.to(device, non_blocking=True), group=group)
        back.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    return back.view(R, -1).tolist()


_AGREED = threading.local()  # .metas: what `agreed` hands to this thread's next cp_linear_attention


@contextlib.contextmanager
def agreed(metas):
    """Around an op's one context-parallel core call, where the op has run `agree` on its own inputs already (so every
    rank has passed its checks): the core call takes `metas` (per rank in rank order: [slice length, whether it passes
    an initial state]) instead of a second metadata gather. Each gather holds the host until the slowest rank
    arrives (mLSTMexp on 2 H200s, T 131072: one gather instead of two took 0.7 ms off ~13 per forward+backward).
    The core call's inputs are then the op's, derived alike on every rank; an error in its local pass (e.g. out of
    memory) is raised on that rank alone, as anywhere else after the gather."""
    _AGREED.metas = metas
    try:
        yield
    finally:
        _AGREED.metas = None


def _box(wanted, rd):
    """For the local pass of a rank that a state enters (eager runs): the core's backward then runs from that
    state (op.BackwardInitialState; with `ones` the ones kernels' backward, from [S | n]) and forms every gradient
    but the state's own, which the entry term forms alone. Not with a right decay (its gradient reads the forward's
    output, which lacks the entry term), nor under torch.compile (the custom ops take no box): the entry term then
    forms all its gradients (mLSTMexp on 2 H200s at T 131072: two dq passes, 0.56 ms, before `ones` took the box)."""
    return BackwardInitialState() if wanted and rd is None and not torch.compiler.is_compiling() else None


def _entering_rows(E, h0_rows, n_pieces, entry):
    """The initial state of the local pass's backward: E [Bs, H, K, V] without varlen; with it one row per piece,
    the initial state's rows of the pieces that start here (h0_rows, or zeros) and E in the entry piece's row."""
    E = E.detach()
    if n_pieces == 1 and h0_rows is None:
        return E.contiguous()
    rows = (h0_rows.detach().to(E.dtype).clone() if h0_rows is not None
            else E.new_zeros((n_pieces,) + tuple(E.shape[1:])))
    rows[entry] = E[0]
    return rows


def slice_plans(lengths, c, reverse, has_h0, who):
    """From the slice lengths of all ranks (rank order), the global offsets c (None without varlen) and which
    ranks pass an initial state: (the plan of every rank (see `_plan`), the global start of every slice)."""
    total = sum(lengths)
    if c is not None and c[-1] != total:
        raise ValueError(f"cu_seqlens must end at the total length over all ranks' slices, {total} "
                         f"(slices {lengths}), got {c[-1]}")
    starts = [sum(lengths[:j]) for j in range(len(lengths))]
    plans = _plan(c if c is not None else [0, total], [(s, s + t) for s, t in zip(starts, lengths)], reverse)
    if any(has_h0):
        need = [j for j in range(len(lengths)) if any(plans[j]["starts"]) and not has_h0[j]]
        if need:
            raise ValueError(f"{who}: initial_state is given on some ranks but not on rank(s) {need}, "
                             "where sequences start; pass it (the same tensor) there too")
    return plans, starts


def _plan(c, bounds, reverse):
    """Per rank, from the global sequence offsets c (without varlen [0, T]) and the slices (s, e):
    the local pieces (global sequence n, local start a, local end b), which piece enters (receives the
    state of the previous rank in scan order) and which exits, whether the entry piece crosses in, whether
    the state passes through the whole slice, and per piece whether it owns its sequence's final state
    and starts its sequence (uses the initial state)."""
    plans = []
    for s, e in bounds:
        n0 = bisect.bisect_right(c, s) - 1
        n1 = bisect.bisect_left(c, e) - 1
        pieces = [(n, max(c[n], s) - s, min(c[n + 1], e) - s) for n in range(n0, n1 + 1)]
        if not reverse:
            entry, exit_, cross = 0, len(pieces) - 1, c[n0] < s
            owns = [c[n + 1] <= e for n, _, _ in pieces]
            starts = [c[n] >= s for n, _, _ in pieces]
        else:
            entry, exit_, cross = len(pieces) - 1, 0, c[n1 + 1] > e
            owns = [c[n] >= s for n, _, _ in pieces]
            starts = [c[n + 1] <= e for n, _, _ in pieces]
        plans.append(dict(pieces=pieces, entry=entry, exit=exit_, cross=cross, through=cross and len(pieces) == 1,
                          owns=owns, starts=starts))
    return plans


def cp_linear_attention(q, k, v, ld=None, rd=None, *, cp_group, scale=None, initial_state=None,
                        output_final_state=False, cu_seqlens=None, chunk_size=None, backend="auto", reverse=False,
                        precision=None, key_gate=None, ones=False):
    """`linear_attention` on this rank's contiguous slice of the sequence, the slices of `cp_group`'s ranks
    (in rank order) making up the whole. Arguments as in `linear_attention`, per slice ([B, T_r, H, ...]),
    except `cu_seqlens` (global offsets, the same on every rank) and `initial_state` (see the module
    docstring). Returns (o for this slice, final state (the same on every rank) or None).
    ones: `linear_attention_with_ones` instead (values [v, 1], the column implicit; left decay, forward): the
    initial and final states are tuples (S [.., K, V], n [.., K]), it returns (o, den, final state or None), and
    the state crosses the ranks as [S | n]. The local pass takes the ones kernels, whose den and its gradient stay
    float32, and the entry term's den column is formed in float32 both ways: through an explicit [v, 1] in bf16
    the terms of the column and of v nearly cancel in dq where |den| is small (mLSTMexp on 2 H200s, signed q, k:
    dq 0.17-0.55 from float32 against one GPU's 3.3e-2)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("cp_group needs an initialized torch.distributed process group "
                           f"(torch.distributed.init_process_group first), got {type(cp_group).__name__}")
    if not isinstance(cp_group, dist.ProcessGroup):
        raise TypeError(f"cp_group must be a torch.distributed ProcessGroup, got {type(cp_group).__name__}")
    R, rank = dist.get_world_size(cp_group), dist.get_rank(cp_group)
    if ones:
        assert rd is None and not reverse, "cp_linear_attention(ones=True): left decay, forward only"
        if R == 1:
            return linear_attention_with_ones(q, k, v, ld, scale=scale, initial_state=initial_state,
                                              output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                              chunk_size=chunk_size, backend=backend, key_gate=key_gate)
        if initial_state is not None:  # [S0 | n0]: the state that crosses the ranks
            initial_state = torch.cat([initial_state[0], initial_state[1].unsqueeze(-1)], -1)
    if R == 1:
        return linear_attention(q, k, v, ld, rd, precision=precision, scale=scale, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                chunk_size=chunk_size, backend=backend, reverse=reverse, key_gate=key_gate)
    # 0. checks, then one metadata all-gather so that a bad input anywhere raises everywhere (no hang)
    who = "cp_linear_attention"
    err = None
    try:
        _local_checks(q, k, v, ld, rd, scale, initial_state, cu_seqlens, chunk_size, backend, key_gate, ones)
    except (TypeError, ValueError) as e:
        err = e
    names = ("B", "H", "K", "V", "dtypes of q, k, v, ld, rd, key_gate", "ld kind", "rd given", "reverse",
             "output_final_state", REQUIRES_GRAD, "number of sequences", "cu_seqlens")
    vals, own = [0] * len(names), [0, 0]
    if err is None:
        B, T, H, K = q.shape
        V = v.shape[-1] + int(ones)  # the state's width
        c = list(host_values(cu_seqlens)) if cu_seqlens is not None else None
        tensors = (q, k, v, ld, rd, initial_state, key_gate)
        needs_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)
        vals = [B, H, K, V, dtype_code(q, k, v, ld, rd, key_gate), _ld_code(ld), rd is not None, bool(reverse),
                bool(output_final_state), needs_grad, -1 if c is None else len(c) - 1, cu_hash(cu_seqlens)]
        own = [T, initial_state is not None]
        scale = K ** -0.5 if scale is None else float(scale)
    local_out = box = None

    def local_pass(h0, cu):
        """(o, state rows) of this slice from h0 (ones: o is the pair (o, den), the rows [S | n])."""
        if not ones:
            return linear_attention(q, k, v, ld, rd, precision=precision, scale=scale, initial_state=h0,
                                    output_final_state=True, cu_seqlens=cu, chunk_size=chunk_size, backend=backend,
                                    reverse=reverse, key_gate=key_gate)
        o_, den_, (S_, n_) = linear_attention_with_ones(
            q, k, v, ld, scale=scale, initial_state=None if h0 is None else (h0[..., :-1], h0[..., -1]),
            output_final_state=True, cu_seqlens=cu, chunk_size=chunk_size, backend=backend, key_gate=key_gate)
        return (o_, den_), torch.cat([S_, n_.unsqueeze(-1)], -1)
    if err is None and cu_seqlens is None:
        # 1 (before the metadata gather, without varlen): the local pass needs no other rank's length, so it is
        # queued first and the gather's wait on the GPU overlaps it (the first rank in scan order starts from
        # the initial state, every other from zero). An error here is raised on every rank by `agree`.
        try:
            first = rank == (R - 1 if reverse else 0)
            box = _box(needs_grad and not first, rd)
            with backward_initial_state(box):
                local_out = local_pass(initial_state if first else None, None)
        except (TypeError, ValueError, RuntimeError) as e:
            err = e
    metas, _AGREED.metas = getattr(_AGREED, "metas", None), None  # taken once: not by a nested call
    if metas is None:
        metas = agree(cp_group, err, list(zip(names, vals)), own, q.device, who)
    elif err is not None:
        raise err
    lengths = [m[0] for m in metas]
    total = sum(lengths)
    varlen = c is not None
    plans, starts = slice_plans(lengths, c, bool(reverse), [bool(m[1]) for m in metas], who)

    sdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    me = plans[rank]
    pieces = me["pieces"]

    # 1. local pass: the crossing-in piece starts from zero, pieces that start here from their initial state
    cu_loc = local_offsets(me, cu_seqlens)
    if local_out is not None:
        assert me["starts"] == [first], "the early local pass assumed another plan"
    else:  # varlen (without it the local pass ran above, or `agree` raised)
        box = _box(needs_grad and me["cross"], rd)
        h0_loc = None
        if initial_state is not None and any(me["starts"]):
            rows = [initial_state[n] if st else torch.zeros_like(initial_state[n])
                    for (n, _, _), st in zip(pieces, me["starts"])]
            h0_loc = torch.stack(rows)
        with backward_initial_state(box):
            local_out = local_pass(h0_loc, cu_loc)
    o, F_loc = local_out
    Bs = 1 if varlen else B  # batch of the state rows: one per piece with varlen, B without
    F_loc = F_loc.to(sdt).reshape(len(pieces), Bs, H, K, V)

    # total log decays of the entry piece (the whole slice when the state passes through)
    _, a0, b0 = pieces[me["entry"]]
    gl = _canonical_left(ld, T)
    if box is not None and gl is not None:
        # the core's backward, from the entering state, forms the decay's gradient of D ⊙ E and of the entry term
        gl = gl.detach()
    L0 = (gl[:, a0:b0].sum(1, dtype=sdt).expand(Bs, H, K) if gl is not None
          else torch.zeros(Bs, H, K, dtype=sdt, device=q.device))
    R0 = rd[:, a0:b0].sum(1, dtype=sdt) if rd is not None else torch.zeros(Bs, H, V, dtype=sdt, device=q.device)

    # 2. one all-gather of (state rows, L0, R0): all piece states when the final states are wanted, else the exit one
    ofs = bool(output_final_state)
    nrows = max(len(p["pieces"]) for p in plans) if ofs else 1
    rows = F_loc if ofs else F_loc[me["exit"]:me["exit"] + 1]
    if rows.shape[0] < nrows:
        rows = torch.cat([rows, rows.new_zeros((nrows - rows.shape[0],) + tuple(rows.shape[1:]))])
    buf = torch.cat([rows.reshape(-1), L0.reshape(-1), R0.reshape(-1)])
    G = gather(buf, cp_group, needs_grad)
    n_st = nrows * Bs * H * K * V
    G_rows = G[:, :n_st].view(R, nrows, Bs, H, K, V)
    G_L = G[:, n_st:n_st + Bs * H * K].view(R, Bs, H, K)
    G_R = G[:, n_st + Bs * H * K:].view(R, Bs, H, V)

    def decay(j):
        return torch.exp(G_L[j].unsqueeze(-1) + G_R[j].unsqueeze(-2))

    # 3. the scan over ranks in scan order (every rank runs it on the same gathered data)
    order = list(range(R)) if not reverse else list(range(R - 1, -1, -1))
    E_in, E = {}, None
    last = order[-1] if ofs else rank
    for j in order:
        E_in[j] = E if plans[j]["cross"] else None
        if j == last:
            break
        X = G_rows[j, plans[j]["exit"] if ofs else 0]
        if plans[j]["through"] and E is not None:
            X = X + decay(j) * E
        E = X

    # 4. the correction of this rank's entry piece by the state that enters it
    Ein = E_in[rank]

    def spliced(x, piece):  # x with the entry piece's rows [a0, b0) replaced by piece
        return piece if (a0, b0) == (0, T) else torch.cat([x[:, :a0], piece, x[:, b0:]], 1)
    if ones:
        o, den = o
    if Ein is not None:
        qe = q if box is None else q.detach()
        if box is not None:  # with `ones`, [S | n]
            box.value = _entering_rows(Ein, h0_loc if varlen else None, len(pieces), me["entry"])
        gle = gl[:, a0:b0] if gl is not None else None
        if ones:  # [S | n]: the den column's term from the same reads of q, float32 both ways
            Ein, E_n = Ein[..., :-1], Ein[..., -1:]
            piece, dpiece = add_entry_term(o[:, a0:b0], qe[:, a0:b0], gle, None, Ein, scale, False, backend,
                                           column=(den[:, a0:b0], E_n))
            den = spliced(den, dpiece)
        else:
            piece = add_entry_term(o[:, a0:b0], qe[:, a0:b0], gle, rd[:, a0:b0] if rd is not None else None, Ein,
                                   scale, reverse, backend)
        o = spliced(o, piece)
    if needs_grad:
        o = tie(o, G)
        if initial_state is not None and initial_state.requires_grad and not any(me["starts"]):
            o = tie(o, initial_state)  # unused here: a zero gradient, ready for the all-reduce over ranks

    if not ofs:
        return (o, den, None) if ones else (o, None)
    # final states: each sequence's from the rank where it ends (in scan direction), the same on every rank
    N = len(c) - 1 if varlen else 1
    owner, piece = [], []
    for n in range(N):
        pos = (c[n + 1] - 1 if not reverse else c[n]) if varlen else (total - 1 if not reverse else 0)
        j = bisect.bisect_right(starts, pos) - 1
        owner.append(j)
        piece.append(n - plans[j]["pieces"][0][0])
    dev = q.device
    finals = G_rows[torch.tensor(owner, device=dev), torch.tensor(piece, device=dev)]  # [N, Bs, H, K, V]
    fix_idx, fix_rows = [], []
    for j in range(R):
        p = plans[j]
        if p["cross"] and p["owns"][p["entry"]] and E_in[j] is not None:
            fix_idx.append(p["pieces"][p["entry"]][0])
            fix_rows.append(decay(j) * E_in[j])
    if fix_rows:
        finals = finals.index_add(0, torch.tensor(fix_idx, device=dev), torch.stack(fix_rows))
    S = finals.reshape(N, H, K, V) if varlen else finals[0]
    S = S.to(sdt)  # as one process returns it: float32, float64 for float64 inputs (whatever initial_state's)
    return (o, den, (S[..., :-1], S[..., -1])) if ones else (o, S)


def _gather_plain(x, group):
    out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, x.contiguous(), group=group)
    return torch.stack(out)
