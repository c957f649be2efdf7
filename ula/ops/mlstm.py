"""The mLSTM cell (paper 003, §2.1 and §4.1): a scalar forget gate and an input gate on the key.

Gate pre-activations i, f are [B, T, H]; the forget gate is σ(f), in log space logσ(f) <= 0.

mLSTMsig (Eq. 19-20): C_t = σ(f_t) C_{t-1} + σ(i_t) k_t v_tᵀ,  h_t = C_tᵀ q_t · scale.
    One core call: keys k·σ(i), scalar log decay logσ(f). State C [B, H, K, V].

mLSTMexp (Eq. 1-4), with the max state m and the normalizer n:
    m_t = max(logσ(f_t) + m_{t-1}, i_t)
    C_t = exp(logσ(f_t) + m_{t-1} − m_t) C_{t-1} + exp(i_t − m_t) k_t v_tᵀ
    n_t = exp(logσ(f_t) + m_{t-1} − m_t) n_{t-1} + exp(i_t − m_t) k_t
    h_t = C_tᵀ q_t·scale / (max(|n_tᵀ q_t·scale|, exp(−m_t)) + eps)
    (eps = 0 is Eq. 4 exactly; the default 1e-6 is the guard the TFLA kernels add.) States (C, n, m).

How mLSTMexp runs on the core. This *is* a core recurrence, once the max state is known: the stabilized
decay ld'_t = logσ(f_t) + m_{t-1} − m_t and the stabilized input weight w_t = exp(i_t − m_t) are both
<= 0 in log space (m_t >= logσ(f_t) + m_{t-1} and m_t >= i_t by its definition), so one core call with
keys k·w, scalar decay ld' and values v' = [v, 1] gives the numerator Cᵀq (first V columns) and the
normalizer nᵀq (last column); the core state is [C | n]. No exponent that is ever materialized is
positive, so gates ĩ of any size and forget gates of any strength stay finite: exp(i − m) <= 1, the core
only forms exp of sums of ld' <= 0, and exp(−m) is clamped to the float32 range (where it would pass it,
h underflows to 0 either way).

The max state is a scan, but a closed form one: with F_t = Σ_{u<=t} logσ(f_u) (per sequence),
    m_t = F_t + max(m_0, max_{s<=t} (i_s − F_s))
(unrolling Eq. 1: m_t is the largest of m_0 + F_t and i_s + F_t − F_s, s <= t). So m is a cumsum and
a cummax along time, done in float64 (F grows linearly with T; float64 keeps the differences i_s − F_s
exact enough for any practical length), per sequence (packed: one scan over all tokens, `_exp_scan`).
Gradients. The core sees only detached copies m̂ of the max state: keys k·exp(i − m̂), decays
logσ(f) + m̂_{t-1} − m̂_t, and the initial state times exp(m_0 − m̂_0) (value 1). Its outputs are then
(like its final state) exactly (Cᵀq, nᵀq)·exp(−m̂) as functions of i, f, m_0 and the rest, and a factor
exp(m̂ − m) (value 1) puts the live m back (on the final state too), before h = num / (max(|den|, exp(−m)) + eps).
So the gradient is exact (with eps > 0 h does depend on m) while the core's log-decay gradients carry no m terms
that would only cancel: those are formed as differences of O(1) float32 sums (paper 002 §4.3), and terms that
cancel there leave noise.
On the Triton backend the gate scan (m, ld', i − m̂ and their gradients) is one kernel each way
(ula/ops/_mlstm_gate_kernels.py); `_exp_gates` is its PyTorch form (backend="torch", context parallelism). So is
the epilogue, h from o, den and m (ula/ops/_mlstm_epilogue.py; `_exp_epilogue_torch` also for float64 inputs).
Rounding can leave ld' a hair above 0 where the max keeps the decay branch; it is clipped to 0 with the
gradient passed straight through. Unlike the TFLA kernels, the gradient through the normalizer is kept.

Without an initial state, m_0 = 0 (the all-zero state (C, n, m) = (0, 0, 0)), as in the reference."""
import torch
import torch.nn.functional as F

from ..core import linear_attention
from ..core.api import one_sequence_as_batch
from ..core.backends import runs_fused, runs_triton
from ..core.cu_cache import host_values
from ..core.context_parallel import raised_everywhere
from ..core.ones import linear_attention_with_ones, with_ones_column
from ..core.time_scan import scan_time
from ..core.checks import check_state_dtype, short_repr
from ._checks import check_float, check_number, check_sequence, check_state_tuple, check_step_qkv, num_sequences
from ._common import PackedTokens, _step, cumsum_per_sequence, decay_dtype, last_step, per_step, state_dtype

VARIANTS = ("exp", "sig")


def _check_variant(op, variant):
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise ValueError(f"{op}: variant must be one of {VARIANTS}, got {short_repr(variant)}")


def _check_gates(op, shape, what, i, f, device, values):
    """values: i, f must be finite (any finite size works, e.g. i = +60, f = -30), checked here on the user's
    tensors: a bad value would otherwise surface in the core under its internal names (ld, key_gate)."""
    for name, x in (("i", i), ("f", f)):
        check_float(op, f"{name} (gate pre-activation)", x, shape, what, device=device, finite=values)


def _check_state(op, variant, state, N, H, K, V, device, dim="B", values=False):
    """values: the max state m must be finite (as the gates must)."""
    if state is None:
        return
    if variant == "sig":
        if not isinstance(state, torch.Tensor):
            raise TypeError(f"{op}: the state for variant='sig' must be one tensor C [{dim}, H, K, V] = "
                            f"{(N, H, K, V)}, got {type(state).__name__}")
        check_float(op, "state (C)", state, (N, H, K, V), f"[{dim}, H, K, V]", device=device)
    else:
        check_state_tuple(op, state, [("C", (N, H, K, V), f"[{dim}, H, K, V]"), ("n", (N, H, K), f"[{dim}, H, K]"),
                                      ("m", (N, H), f"[{dim}, H]")], device=device, finite=("m",) if values else ())
        if not state[1].dtype == state[2].dtype == state[0].dtype:
            raise TypeError(f"{op}: the state's parts (C, n, m) must share one dtype, got "
                            f"{', '.join(str(x.dtype) for x in state)}")


def _straight_through_nonpositive(x):
    """min(x, 0) in value, identity in gradient (removes rounding residue above 0)."""
    return x - x.detach().clamp_min(0)


def _exp_scan(i, f, tokens):
    """float64 logσ(f), i, F = cumsum logσ(f) and cummax(i − F) along time, each restarted at every sequence's first
    step (tokens: the PackedTokens of a packed call, else None). Packed, each is one scan over all tokens, with no
    padding and no read of cu_seqlens' values: F less its value before the sequence, and for the cummax every
    sequence's values raised by its index times a margin above their spread (so its first step tops every earlier
    one), taken off after the scan: an error of about (margin · N) float64 ulps."""
    lf, ip = F.logsigmoid(f.double()), i.double()
    Fc = cumsum_per_sequence(lf, tokens)
    if tokens is None:
        return lf, ip, Fc, scan_time(ip - Fc, lambda y: y.cummax(-1).values)
    x = ip - Fc
    spread = x.detach().amax() - x.detach().amin()  # the gates are checked finite
    offset = ((2.0 * spread + 1.0) * tokens.seq).view(1, -1, 1)
    return lf, ip, Fc, scan_time(x + offset, lambda y: y.cummax(-1).values) - offset


def _exp_gates(i, f, m0, tokens, scan=None):
    """float64 gate prep. i, f [B, T, H] (packed: tokens, its PackedTokens, else None); m0 [N, H] or None; scan:
    `_exp_scan` of them if at hand. Returns the core's log decay ld' and log input weight i - m̂ (m̂ detached),
    m [B, T, H] and m_T [N, H] (live), all float64."""
    lf, ip, Fc, M = scan if scan is not None else _exp_scan(i, f, tokens)
    before = None if m0 is None else per_step(m0.double(), tokens)  # m before each step's sequence
    M = torch.maximum(M, before) if before is not None else M.clamp_min(0.0)
    m = Fc + M
    mh = m.detach()
    before = before.detach() if before is not None else torch.zeros_like(mh[:, :1])
    m_prev = torch.cat([before[:, :1], mh[:, :-1]], 1)
    if tokens is not None:
        m_prev = torch.where(tokens.starts.view(1, -1, 1), before, m_prev)
    ldp = _straight_through_nonpositive(lf + (m_prev - mh))
    logw = _straight_through_nonpositive(ip - mh)
    return ldp, logw, m, last_step(m, tokens)


def _one(x):
    """exp(x - x.detach()): the value 1 with the gradient of exp(x)."""
    return torch.exp(x - x.detach())


def _denominator(den, m, eps):
    cap = torch.finfo(torch.float32).max if den.dtype != torch.float64 else torch.finfo(torch.float64).max
    lower = torch.exp(-m).clamp(max=cap).to(den.dtype)
    return torch.maximum(den.abs(), lower) + eps


def _exp_epilogue_torch(o, den, m, eps):
    """h = o f / (max(|den f|, exp(-m)) + eps) with f = exp(m̂ - m) (value 1: puts the live max state back)."""
    f = _one(-m)
    # the per-step factor first, so [B, T, H, V] sees one multiply
    return o * (f / _denominator(den * f.to(den.dtype), m, eps)).unsqueeze(-1).to(o.dtype)


def _check_inputs(q, k, v, i, f, variant, initial_state, cu_seqlens, chunk_size, backend, scale, cp):
    """The op's checks; with context parallelism (cp) cu_seqlens is global, its end checked with the slices."""
    check_sequence(q, k, v, None if cp else cu_seqlens, chunk_size, backend, scale)
    if cp:
        from ..core.context_parallel import check_global_cu
        check_global_cu(cu_seqlens, q.shape[0])
    _check_gates("mlstm", q.shape[:3], "[B, T, H]", i, f, q.device, True)
    _check_state("mlstm", variant, initial_state, num_sequences(q, cu_seqlens), *q.shape[2:], v.shape[-1], q.device,
                 "B" if cu_seqlens is None else "N", True)
    if initial_state is not None:  # the core's rule, said here before context parallelism's metadata gather: a state
        # passed only where sequences start (the first rank) must raise on every rank, not on that one alone
        check_state_dtype(initial_state if variant == "sig" else initial_state[0], q, "mlstm")


def mlstm(q, k, v, i, f, variant="exp", *, eps=1e-6, scale=None, initial_state=None, output_final_state=False,
          cu_seqlens=None, chunk_size=None, backend="auto", cp_group=None):
    """The mLSTM cell (paper 003) on the core; see the module docstring for the equations.
    cp_group: context parallelism over a torch.distributed group, each rank passing its contiguous slice of T
    (cu_seqlens global; see ula/core/context_parallel.py), both variants ("exp": see `_mlstm_exp_cp`).

    q, k [B, T, H, K]; v [B, T, H, V]; i, f [B, T, H] input and forget gate pre-activations.
    variant "exp" (exponential input gate, max and normalizer states) or "sig" (sigmoid input gate).
    scale defaults to K ** -0.5 (the paper's q / sqrt(d_qk)); eps only matters for "exp".
    States: "sig" C [B, H, K, V]; "exp" a tuple (C [B, H, K, V], n [B, H, K], m [B, H]), float32
    ([N, ...] with cu_seqlens). Returns (h [B, T, H, V], final state or None).
    initial_state, output_final_state, cu_seqlens, chunk_size, backend: as in `ula.linear_attention`."""
    with raised_everywhere(cp_group, "mlstm"):  # with cp_group: a check failing here raises on every rank
        _check_variant("mlstm", variant)
        check_number("mlstm", "eps", eps, nonneg=True, what=" (0 is Eq. 4 exactly)")
    kw = dict(scale=scale, output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
              backend=backend)
    if cp_group is not None and variant == "exp":
        return _mlstm_exp_cp(q, k, v, i, f, eps, initial_state, cp_group, kw)
    with raised_everywhere(cp_group, "mlstm"):
        _check_inputs(q, k, v, i, f, variant, initial_state, cu_seqlens, chunk_size, backend, scale,
                      cp_group is not None)
    if cp_group is None:
        cu_seqlens = kw["cu_seqlens"] = one_sequence_as_batch(q, cu_seqlens)
    ddt = decay_dtype(q)
    if variant == "sig":
        # the input gate σ(ĩ) as a key gate: the kernels scale k as they read it (no gated copy of k)
        return linear_attention(q, k, v, F.logsigmoid(f.to(ddt)), initial_state=initial_state, cp_group=cp_group,
                                key_gate=F.logsigmoid(i.to(ddt)), **kw)
    m0 = None if initial_state is None else initial_state[2]
    if runs_triton(backend, q.device):
        # two Triton launches each way for the gate scan (ula/ops/_mlstm_gate_kernels.py): the ~60 small float64
        # ops of `_exp_gates` and their backward cost the host more than the GPU's work; ld' and logw come in
        # the core's dtype (cast there from float64, as `_exp_run` would). Under torch.compile too, as a custom op
        from ._mlstm_gate_kernels import mlstm_exp_gates
        ldp, logw, m, mT = mlstm_exp_gates(i, f, m0, cu_seqlens, decay_dtype(q))
    else:
        tokens = None if cu_seqlens is None else PackedTokens.of(cu_seqlens, q.shape[1], q.device)
        ldp, logw, m, mT = _exp_gates(i, f, m0, tokens)
    return _exp_run(q, k, v, ldp, logw, m, mT, initial_state, eps, kw)


def _exp_run(q, k, v, ldp, logw, m, mT, initial_state, eps, kw, anchor=None):
    """mLSTMexp from its gates (`_exp_gates`): one core call (keys k·exp(i − m̂), decay ld', values [v, 1]),
    then the live max state put back and the normalizer divided out. anchor: tied to the keys (context
    parallelism: see `_mlstm_exp_cp`)."""
    # exp(ĩ − m̂) as a key gate, applied by the kernels as they read k
    ks, gate = k, logw.to(decay_dtype(q))
    if anchor is not None:
        from ..core.context_parallel import tie
        ks = tie(k, anchor)
    init = None
    if initial_state is not None:
        C0, n0, m0 = initial_state
        f0 = _one(m0.double()).to(C0.dtype)
        init = (C0 * f0[..., None, None], n0 * f0[..., None])
    # numerator and normalizer in one core call: values [v, 1], the column of ones implicit (ula/core/ones.py)
    o, den, fin = linear_attention_with_ones(q, ks, v, ldp.to(decay_dtype(q)), initial_state=init, key_gate=gate,
                                             **kw)
    epilogue = _exp_epilogue_torch
    if runs_fused(kw["backend"], q.device) and torch.float64 not in (o.dtype, den.dtype):
        # the same h and gradients in one Triton kernel each way (ula/ops/_mlstm_epilogue.py): the ~10 small ops
        # of the PyTorch form and their backward cost the host more than the GPU's work
        from ._mlstm_epilogue import mlstm_exp_epilogue as epilogue
    h = epilogue(o, den, m, eps)
    if fin is None:
        return h, None
    S, n = fin
    fT = _one(-mT).to(S.dtype)  # exp(m̂_T - m_T): the state is (C̄, n̄) exp(-m_T)
    return h, (S * fT[..., None, None], n * fT[..., None], mT.to(S.dtype))


def _exp_pieces(i, f, tokens, offsets, scan, N):
    """Of each of the N sequences of i, f [B, T, H] (packed: tokens and offsets, the PackedTokens and cu_seqlens of
    the pieces): F_total = Σ logσ(f) and m_alone = F_total + max_t (i_t − F_t), the max state that leaves it from an
    entering −∞ (`_mlstm_exp_cp`), each [N, H] float64 and differentiable. From scan (`_exp_scan`) where the PyTorch
    path has it, else from the gate kernels' m_T with a floor below every i − F (it then takes no part)."""
    if scan is not None:
        _, _, Fc, M = scan
        F_total = last_step(Fc, tokens)
        return F_total, F_total + last_step(M, tokens)
    from ._mlstm_gate_kernels import mlstm_exp_gates
    lf = F.logsigmoid(f.double())
    F_total = lf.sum(1) if tokens is None else last_step(cumsum_per_sequence(lf, tokens), tokens)
    floor = torch.full((N, i.shape[2]), -1e30, dtype=torch.float64, device=i.device)
    return F_total, mlstm_exp_gates(i, f, floor, offsets)[3]


def _mlstm_exp_cp(q, k, v, i, f, eps, initial_state, group, kw):
    """mLSTMexp with context parallelism. The max state is a scan across ranks too: over a piece of a sequence
    (a rank's slice, or the part of a packed sequence on it), with F the piece's own cumulative logσ(f) and
    P = max over the piece of (i_s − F_s), the max state leaving it is

        m_exit = F_total + max(m_enter, P) = max(F_total + m_enter, m_alone),   m_alone = F_total + P
                                                       (the closed form of the module docstring, per piece)

    m_alone being the max state that leaves the piece from an entering −∞ (on the Triton backend the gate kernels'
    m_T from a floor far below every i − F: no PyTorch scan). So every rank sends (F_total, m_alone, and its
    initial m_0 where a sequence starts) of each of its pieces in one small differentiable all-gather (float64),
    and every rank runs the scan over ranks and pieces: the max state entering its own pieces, and each
    sequence's final m. Locally m_t = F_t + max(m_enter, cummax(i − F)_t) is then exactly the global max state, so
    the core's keys k·exp(i − m̂) and decays ld' are those of the single-process call and
    `linear_attention(..., cp_group=group)` carries the stabilised [C | n] across ranks.
    Gradients of i, f and m_0 of earlier ranks reach them through the all-gather's backward. The keys are tied
    to the gathered data (`tie`) so that on every rank the backward runs the core's collective before this
    one (the same order everywhere)."""
    import torch.distributed as dist

    from ..core import context_parallel as cp
    if not (dist.is_available() and dist.is_initialized()) or not isinstance(group, dist.ProcessGroup):
        raise TypeError("mlstm: cp_group must be a torch.distributed ProcessGroup of an initialized process group, "
                        f"got {type(group).__name__}")
    R, rank = dist.get_world_size(group), dist.get_rank(group)
    cu_seqlens = kw["cu_seqlens"]
    if R == 1:
        return mlstm(q, k, v, i, f, "exp", eps=eps, initial_state=initial_state, **kw)
    who = "mlstm (cp_group)"
    err = None
    try:
        _check_inputs(q, k, v, i, f, "exp", initial_state, cu_seqlens, kw["chunk_size"], kw["backend"], kw["scale"],
                      True)
    except (TypeError, ValueError) as e:
        err = e
    names = ("B", "H", "K", "V", "dtypes of q, k, v, i, f", "output_final_state", cp.REQUIRES_GRAD,
             "number of sequences", "cu_seqlens")
    vals, own = [0] * len(names), [0, 0]
    if err is None:
        B, T, H, K = q.shape
        tensors = (q, k, v, i, f) + tuple(initial_state or ())
        needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in tensors)
        N = num_sequences(q, cu_seqlens)
        vals = [B, H, K, v.shape[-1], cp.dtype_code(q, k, v, i, f), bool(kw["output_final_state"]), needs_grad, N,
                cp.cu_hash(cu_seqlens)]
        own = [T, initial_state is not None]
    metas = cp.agree(group, err, list(zip(names, vals)), own, q.device, who)
    c = list(host_values(cu_seqlens)) if cu_seqlens is not None else None
    plans, _ = cp.slice_plans([m[0] for m in metas], c, False, [bool(m[1]) for m in metas], who)
    me = plans[rank]
    Np, Bs = len(me["pieces"]), (1 if c is not None else B)

    # this rank's pieces: (F_total, m_alone, m_0 where the piece starts its sequence), gathered from every rank
    offsets = cp.local_offsets(me, cu_seqlens)
    tokens = None if offsets is None else PackedTokens.of(offsets, T, q.device)
    triton = runs_triton(kw["backend"], q.device)
    scan = None if triton else _exp_scan(i, f, tokens)
    m0 = initial_state[2].double() if initial_state is not None else None
    zero = torch.zeros(Bs, H, dtype=torch.float64, device=q.device)
    first = [(m0[n:n + 1] if c is not None else m0) if st and m0 is not None else zero
             for (n, _, _), st in zip(me["pieces"], me["starts"])]
    F_total, m_alone = _exp_pieces(i, f, tokens, offsets, scan, Np * Bs)
    rows = torch.stack([F_total.view(Np, Bs, H), m_alone.view(Np, Bs, H), torch.stack(first)], -1)
    nrows = max(len(p["pieces"]) for p in plans)
    buf = torch.cat([rows.reshape(-1), rows.new_zeros((nrows - Np) * Bs * H * 3)])
    G = cp.gather(buf, group, needs_grad).view(R, nrows, Bs, H, 3)

    # the scan over ranks and pieces: m entering this rank's pieces, and each sequence's final m
    run, enter = {}, []
    for j in range(R if kw["output_final_state"] else rank + 1):
        for p, (n, _, _) in enumerate(plans[j]["pieces"]):
            m_in = G[j, p, ..., 2] if plans[j]["starts"][p] else run[n]
            if j == rank:
                enter.append(m_in)
            run[n] = torch.maximum(G[j, p, ..., 0] + m_in, G[j, p, ..., 1])
    if triton:  # this slice's gates from the entering max states, as on one GPU
        from ._mlstm_gate_kernels import mlstm_exp_gates
        ldp, logw, m, _ = mlstm_exp_gates(i, f, torch.cat(enter), offsets, decay_dtype(q))
    else:
        ldp, logw, m, _ = _exp_gates(i, f, torch.cat(enter), tokens, scan)
    mT = None
    if kw["output_final_state"]:
        mT = torch.cat([run[n] for n in range(N)]) if c is not None else run[0]
    with cp.agreed([row[:2] for row in metas]):  # the core call's gather of the same facts, made above
        return _exp_run(q, k, v, ldp, logw, m, mT, initial_state, eps, dict(kw, cp_group=group),
                        anchor=G if needs_grad else None)


def mlstm_step(q, k, v, i, f, state=None, variant="exp", *, eps=1e-6, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V], i, f [B, H]; state as returned by `mlstm`
    (or None for zeros). Returns (h [B, H, V], new state). The state comes before the variant (`mlstm` takes the
    variant sixth): pass variant by name."""
    if isinstance(state, str):
        raise TypeError(f"mlstm_step: state got {state!r}, a variant: the state comes before the variant here "
                        f"(mlstm_step(q, k, v, i, f, state, variant)); pass variant={state!r}")
    _check_variant("mlstm_step", variant)
    check_number("mlstm_step", "eps", eps, nonneg=True, what=" (0 is Eq. 4 exactly)")
    check_step_qkv("mlstm_step", q, k, v, scale=scale)
    # no value checks in a decoding step, as in the other *_step functions
    _check_gates("mlstm_step", q.shape[:2], "[B, H]", i, f, q.device, False)
    _check_state("mlstm_step", variant, state, *q.shape, v.shape[-1], q.device)
    dt = state_dtype(q)
    if variant == "sig":
        ks = k * torch.sigmoid(i.to(dt)).unsqueeze(-1).to(k.dtype)
        return _step(q, ks, v, F.logsigmoid(f.to(dt)), None, state, scale)
    B, H, K = q.shape
    if state is None:
        C0 = torch.zeros(B, H, K, v.shape[-1], dtype=dt, device=q.device)
        n0 = torch.zeros(B, H, K, dtype=dt, device=q.device)
        m0 = torch.zeros(B, H, dtype=dt, device=q.device)
    else:
        C0, n0, m0 = state
    lf = F.logsigmoid(f.double())
    m0 = m0.double()
    m = torch.maximum(lf + m0, i.double())
    ld = _straight_through_nonpositive(lf + (m0 - m).detach())
    logw = _straight_through_nonpositive(i.double() - m.detach())
    ks = k * logw.exp().unsqueeze(-1).to(k.dtype)
    va = with_ones_column(v)
    S0 = torch.cat([C0, n0.unsqueeze(-1)], -1) * _one(m0).to(C0.dtype)[..., None, None]
    o, S = _step(q, ks, va, ld.to(dt), None, S0, scale)
    o = o * _one(-m).unsqueeze(-1).to(o.dtype)  # exp(m̂ - m)
    h = o[..., :-1] / _denominator(o[..., -1:], m.unsqueeze(-1), eps)
    S = S * _one(-m).to(S.dtype)[..., None, None]
    return h, (S[..., :-1], S[..., -1], m.to(S.dtype))
