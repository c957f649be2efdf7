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
exact enough for any practical length), per sequence (cu_seqlens packs are padded for the scan).
Gradients. The core sees only detached copies m̂ of the max state: keys k·exp(i − m̂), decays
logσ(f) + m̂_{t-1} − m̂_t, and the initial state times exp(m_0 − m̂_0) (value 1). Its outputs are then
(like its final state) exactly (Cᵀq, nᵀq)·exp(−m̂) as functions of i, f, m_0 and the rest, and a factor exp(m̂ − m) (value 1)
puts the live m back (on the final state too), before h = num / (max(|den|, exp(−m)) + eps). So the gradient is exact (with eps > 0
h does depend on m) while the core's log-decay gradients carry no m terms that would only cancel: those
are formed as differences of O(1) float32 sums (paper 002 §4.3), and terms that cancel there leave noise.
Rounding can leave ld' a hair above 0 where the max keeps the decay branch; it is clipped to 0 with the
gradient passed straight through. Unlike the TFLA kernels, the gradient through the normalizer is kept.

Without an initial state, m_0 = 0 (the all-zero state (C, n, m) = (0, 0, 0)), as in the reference."""
import torch
import torch.nn.functional as F

from ..core import linear_attention
from ._checks import check_float, check_sequence, check_state_tuple, check_step_qkv, num_sequences
from ._common import PackedLayout, _step, decay_dtype, state_dtype

VARIANTS = ("exp", "sig")


def _check_variant(op, variant):
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise ValueError(f"{op}: variant must be one of {VARIANTS}, got {variant!r}")


def _check_gates(op, shape, what, i, f):
    for name, x in (("i", i), ("f", f)):
        check_float(op, f"{name} (gate pre-activation)", x, shape, what)


def _check_state(op, variant, state, N, H, K, V, dim="B"):
    if state is None:
        return
    if variant == "sig":
        if not isinstance(state, torch.Tensor):
            raise TypeError(f"{op}: the state for variant='sig' must be one tensor C [{dim}, H, K, V] = "
                            f"{(N, H, K, V)}, got {type(state).__name__}")
        check_float(op, "state (C)", state, (N, H, K, V), f"[{dim}, H, K, V]")
    else:
        check_state_tuple(op, state, [("C", (N, H, K, V), f"[{dim}, H, K, V]"), ("n", (N, H, K), f"[{dim}, H, K]"),
                                      ("m", (N, H), f"[{dim}, H]")])


def _straight_through_nonpositive(x):
    """min(x, 0) in value, identity in gradient (removes rounding residue above 0)."""
    return x - x.detach().clamp_min(0)


def _exp_gates(i, f, m0, layout):
    """float64 gate prep. i, f [B, T, H] (packed); m0 [N, H] or None.
    Returns the core's log decay ld' and log input weight i - m̂ (m̂ detached), m [B, T, H] and m_T [N, H]
    (live), all float64."""
    i, f = i.double(), f.double()
    lf = layout.pad(F.logsigmoid(f))
    ip = layout.pad(i)
    Fc = lf.cumsum(1)
    M = (ip - Fc).cummax(1).values
    M = torch.maximum(M, m0.double().unsqueeze(1)) if m0 is not None else M.clamp_min(0.0)
    m = Fc + M
    mh = m.detach()
    m_prev = torch.cat([m0.double().detach().unsqueeze(1) if m0 is not None else torch.zeros_like(mh[:, :1]),
                        mh[:, :-1]], 1)
    ldp = _straight_through_nonpositive(lf + (m_prev - mh))
    logw = _straight_through_nonpositive(ip - mh)
    return layout.unpad(ldp), layout.unpad(logw), layout.unpad(m), layout.last_of(m)


def _one(x):
    """exp(x - x.detach()): the value 1 with the gradient of exp(x)."""
    return torch.exp(x - x.detach())


def _denominator(den, m, eps):
    cap = torch.finfo(torch.float32).max if den.dtype != torch.float64 else torch.finfo(torch.float64).max
    lower = torch.exp(-m).clamp(max=cap).to(den.dtype)
    return torch.maximum(den.abs(), lower) + eps


def mlstm(q, k, v, i, f, variant="exp", *, eps=1e-6, scale=None, initial_state=None, output_final_state=False,
          cu_seqlens=None, chunk_size=64, backend="auto", cp_group=None):
    """The mLSTM cell (paper 003) on the core; see the module docstring for the equations.
    cp_group: context parallelism over a torch.distributed group, variant "sig" only (see
    ula/core/context_parallel.py); "exp" raises NotImplementedError (its max state m would need its own scan).

    q, k [B, T, H, K]; v [B, T, H, V]; i, f [B, T, H] input and forget gate pre-activations.
    variant "exp" (exponential input gate, max and normalizer states) or "sig" (sigmoid input gate).
    scale defaults to K ** -0.5 (the paper's q / sqrt(d_qk)); eps only matters for "exp".
    States: "sig" C [B, H, K, V]; "exp" a tuple (C [B, H, K, V], n [B, H, K], m [B, H]), float32
    ([N, ...] with cu_seqlens). Returns (h [B, T, H, V], final state or None)."""
    _check_variant("mlstm", variant)
    if cp_group is not None and variant == "exp":
        raise NotImplementedError("mlstm: cp_group (context parallelism) supports variant='sig' only; "
                                  "variant='exp' needs a cross-rank scan of its max state m, not implemented")
    check_sequence(q, k, v, None if cp_group is not None else cu_seqlens, chunk_size, backend, scale)
    _check_gates("mlstm", q.shape[:3], "[B, T, H]", i, f)
    _check_state("mlstm", variant, initial_state, num_sequences(q, cu_seqlens), *q.shape[2:], v.shape[-1],
                 "B" if cu_seqlens is None else "N")
    kw = dict(scale=scale, output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
              backend=backend)
    ddt = decay_dtype(q)
    if variant == "sig":
        ks = k * torch.sigmoid(i.to(ddt)).unsqueeze(-1).to(k.dtype)
        return linear_attention(q, ks, v, F.logsigmoid(f.to(ddt)), initial_state=initial_state, cp_group=cp_group,
                                **kw)
    C0 = n0 = m0 = None
    if initial_state is not None:
        C0, n0, m0 = initial_state
    layout = PackedLayout(cu_seqlens, q.shape[1], q.device)
    ldp, logw, m, mT = _exp_gates(i, f, m0, layout)
    ks = k * logw.exp().unsqueeze(-1).to(k.dtype)
    va = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    S0 = None
    if C0 is not None:
        S0 = torch.cat([C0, n0.unsqueeze(-1)], -1) * _one(m0.double()).to(C0.dtype)[..., None, None]
    o, S = linear_attention(q, ks, va, ldp.to(ddt), initial_state=S0, **kw)
    o = o * _one(-m).unsqueeze(-1).to(o.dtype)  # exp(m̂ - m)
    h = o[..., :-1] / _denominator(o[..., -1:], m.unsqueeze(-1), eps)
    if S is None:
        return h, None
    S = S * _one(-mT).to(S.dtype)[..., None, None]  # exp(m̂_T - m_T): the state is [C̄ | n̄] exp(-m_T)
    return h, (S[..., :-1], S[..., -1], mT.to(S.dtype))


def mlstm_step(q, k, v, i, f, state=None, variant="exp", *, eps=1e-6, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V], i, f [B, H]; state as returned by `mlstm`
    (or None for zeros). Returns (h [B, H, V], new state)."""
    _check_variant("mlstm_step", variant)
    check_step_qkv("mlstm_step", q, k, v)
    _check_gates("mlstm_step", q.shape[:2], "[B, H]", i, f)
    _check_state("mlstm_step", variant, state, *q.shape, v.shape[-1])
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
    va = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    S0 = torch.cat([C0, n0.unsqueeze(-1)], -1) * _one(m0).to(C0.dtype)[..., None, None]
    o, S = _step(q, ks, va, ld.to(dt), None, S0, scale)
    o = o * _one(-m).unsqueeze(-1).to(o.dtype)  # exp(m̂ - m)
    h = o[..., :-1] / _denominator(o[..., -1:], m.unsqueeze(-1), eps)
    S = S * _one(-m).to(S.dtype)[..., None, None]
    return h, (S[..., :-1], S[..., -1], m.to(S.dtype))
