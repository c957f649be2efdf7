"""The chunked recurrence F of DESIGN §2 in plain PyTorch (paper 000, Alg. 4-7), for any device.

`chunk_recurrence` is the one function that the forward and every backward pass call. Decays are log
decays; all exponents it takes are differences `b_i - b_j` with i later than j (so never positive): no
division by a cumulative product, nothing that overflows, stable down to -1e4 per step.
Intra-chunk work is batched over all chunks; only the state scan walks the chunks in order.
"""
import torch

from .cu_cache import host_values


def _cumsum_chunks(g, n, C):
    """[B, H, n*C, D] log decay -> inclusive cumulative sum inside each chunk, [B, H, n, C, D]; in float64 for one
    value per step (D = 1): the exponents below are differences b_i - b_j, small against b itself after strong
    decays, and float32 b lost them (up to 1.7e-3 relative in o at chunk 1024, mLSTMexp under its strongest forget
    gates). Each exp is then cast (`_exp`), so the matmuls stay in the compute dtype. Not per feature (D = K): the
    float64 exps over [.., C, K] made a vector decay's f+b 1.7x slower, and its gates (GLA's logσ / 16) are mild."""
    b = g.reshape(*g.shape[:2], n, C, g.shape[-1])
    return (b.to(torch.float64) if g.shape[-1] == 1 else b).cumsum(-2)


def _exp(x, like):
    """exp(x) (float64 exponents) in the dtype of `like`."""
    return x.exp().to(like.dtype)


def _decay_factors(x, dtype):
    """exp(x) in `dtype` for the differences x = b_i - b_j of a log decay's cumulative sums (a fresh tensor:
    overwritten), each clamped to <= 0 first: on and below the diagonal they are <= 0 already (b never rises);
    above it, where they are positive, the clamp keeps exp from overflowing, and the caller's tril_ writes zeros
    there. The float64 differences are rounded to dtype before the exp, not after: the exponent then errs by |x|
    2^-24 in float32 (about 1e-6 relative in the factor where it is not negligible, |x| <= 16), against the float64 b
    whose large values the subtraction cancels (exact in float64). A float64 exp over [.., C, C] took 3/4 of this
    function on a CPU (B32 H2 C64: 4.6 ms against 1.3; benchmarks/RESULTS.md, session 45)."""
    return x.to(dtype).clamp_max_(0).exp_()


def _intra_scalar(q, k, v, b):
    """Intra-chunk output when the decay is the same for every feature (or absent).
    q, k [.., C, K], v [.., C, V], b [.., C, 1] or None. The causal mask is tril_ on the scores (after the decay
    factors), not masked_fill with a broadcast [C, C] mask, which was most of this function's time on a CPU at the
    demo's shape (B32 H2 C64: 3x slower than tril_; benchmarks/RESULTS.md, session 47). In place on the product, whose
    backward needs only its factors: the PyTorch path stays twice differentiable."""
    A = q @ k.transpose(-1, -2)
    if b is not None:
        A = A * _decay_factors(b - b.transpose(-1, -2), A.dtype)
    return A.tril_() @ v


def _intra_vector(q, k, v, b, c):
    """Intra-chunk output with a per-feature left decay b [.., C, K|1] and/or right decay c [.., C, V].

    Secondary chunking taken all the way down (paper 002 §4.3): at each level the blocks of 2h steps are
    split in halves, and every pair (i in the right half, j in the left half) goes through the last step
    r of the left half, exp(b_i - b_j) = exp(b_i - b_r) exp(b_r - b_j), both factors at most 1, so the
    pairs are one matmul. Levels h = C/2, ..., 1 cover every pair i > j; the diagonal i = j has no decay.
    Memory is O(C·D) per chunk at every level: no [C, C, D] tensor. At h <= 2 the pairs are products and sums, not
    matmuls of 2 x 2 or 1 x 1 blocks (on a CPU those cost more than their arithmetic: the demo's GLA shape, B32 T64
    H2 K32, 10-20% of this function; benchmarks/RESULTS.md, session 45), and at h = 1 the left factors, exp(0), are
    left out."""
    C = q.shape[-2]
    o = (q * k).sum(-1, keepdim=True) * v  # i = j
    h = C // 2
    while h >= 1:
        blk = lambda x: x.reshape(*x.shape[:-2], C // (2 * h), 2 * h, x.shape[-1])  # noqa: E731
        qb, kb, vb = blk(q), blk(k), blk(v)
        qR, kL, vL = qb[..., h:, :], kb[..., :h, :], vb[..., :h, :]
        if b is not None:
            bb = blk(b)
            br = bb[..., h - 1:h, :]
            qR = qR * _exp(bb[..., h:, :] - br, qR)
            if h > 1:  # at h = 1 the left half is step r itself
                kL = kL * _exp(br - bb[..., :h, :], kL)
        if c is not None:
            cb = blk(c)
            cr = cb[..., h - 1:h, :]
            if h > 1:
                vL = vL * _exp(cr - cb[..., :h, :], vL)
        if h == 1:
            part = (qR * kL).sum(-1, keepdim=True) * vL
        elif h == 2:
            part = ((qR.unsqueeze(-2) * kL.unsqueeze(-3)).sum(-1).unsqueeze(-1) * vL.unsqueeze(-3)).sum(-2)
        else:
            part = (qR @ kL.transpose(-1, -2)) @ vL
        if c is not None:
            part = part * _exp(cb[..., h:, :] - cr, part)
        ob = blk(o)
        ob[..., h:, :] += part
        h //= 2
    return o


def _chunk_one(q, k, v, gl, gr, scale, h0, C, pad_front=False):
    """Forward chunked recurrence. q, k [B, H, T, K]; v [B, H, T, V]; gl [B|1, H, T, K|1] or None;
    gr [B, H, T, V] or None; h0 [B, H, K, V] or None. Returns o [B, H, T, V], the final state
    [B, H, K, V] and the states entering each chunk [B, H, n, K, V]. Padding to whole chunks goes at the
    end, or at the front with pad_front (so a reversed sequence keeps the chunk borders of the original)."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    n = -(-T // C)
    pad = n * C - T
    if pad:  # zero keys add nothing to the state, zero log decay keeps it
        where = (0, 0, pad, 0) if pad_front else (0, 0, 0, pad)
        q, k, v = (torch.nn.functional.pad(x, where) for x in (q, k, v))
        gl = torch.nn.functional.pad(gl, where) if gl is not None else None
        gr = torch.nn.functional.pad(gr, where) if gr is not None else None
    q, k, v = (x.reshape(B, H, n, C, x.shape[-1]) for x in (q, k, v))
    b = _cumsum_chunks(gl, n, C) if gl is not None else None
    c = _cumsum_chunks(gr, n, C) if gr is not None else None

    # chunk contributions to the state: (k decayed to chunk end)ᵀ (v decayed to chunk end)
    kd = k * _exp(b[..., -1:, :] - b, k) if b is not None else k
    vd = v * _exp(c[..., -1:, :] - c, v) if c is not None else v
    states = kd.transpose(-1, -2) @ vd  # [B, H, n, K, V], overwritten below with the entering states
    S = torch.zeros(B, H, K, V, dtype=q.dtype, device=q.device) if h0 is None else h0.to(q.dtype)
    for i in range(n):
        contrib = states[:, :, i].clone()
        states[:, :, i] = S
        if b is not None:
            S = S * _exp(b[:, :, i, -1, :], S).unsqueeze(-1)
        if c is not None:
            S = S * _exp(c[:, :, i, -1, :], S).unsqueeze(-2)
        S = S + contrib

    # inter-chunk part through the entering states, then the intra-chunk part
    o = (q * _exp(b, q) if b is not None else q) @ states
    if c is not None:
        o = o * _exp(c, o)
    vector = (b is not None and b.shape[-1] > 1) or c is not None
    o = o + (_intra_vector(q, k, v, b, c) if vector else _intra_scalar(q, k, v, b))
    o = (o * scale).reshape(B, H, n * C, V)
    o = o[:, :, pad:] if pad_front else o[:, :, :T]
    return o, S, states


def _shift_flip(g):
    """Reverse time for the reverse recurrence: step t must use the decay of t+1 (0 past the end)."""
    if g is None:
        return None
    return torch.nn.functional.pad(g[:, :, 1:], (0, 0, 0, 1)).flip(2)


def _run(q, k, v, gl, gr, scale, h0, C, reverse):
    """One sequence (or a batch of equal ones). Returns o, final state and the border states: going
    forward the state after each chunk, in reverse the state that enters each chunk from its right end."""
    if not reverse:
        o, S, entering = _chunk_one(q, k, v, gl, gr, scale, h0, C)
        return o, S, torch.cat([entering[:, :, 1:], S.unsqueeze(2)], 2)
    o, S, entering = _chunk_one(q.flip(2), k.flip(2), v.flip(2), _shift_flip(gl), _shift_flip(gr), scale, h0, C,
                                pad_front=True)
    if gl is not None:  # the state leaves through step 1, which decays it once more
        S = S * gl[:, :, 0].exp().unsqueeze(-1)
    if gr is not None:
        S = S * gr[:, :, 0].exp().unsqueeze(-2)
    return o.flip(2), S, entering.flip(2)


def chunk_recurrence(q, k, v, gl=None, gr=None, *, scale=1.0, initial_state=None, cu_seqlens=None,
                     reverse=False, chunk_size=64, out_dtype=None, state_dtype=None):
    """F(q, k, v, L, R, reverse) of DESIGN §2 in [B, T, H, D] layout.

    gl: left log decay in canonical form, None or [B|1, T, H, K|1] (a scalar decay as a trailing 1);
    gr: right log decay, None or [B, T, H, V] (or [.., 1], then moved to the left). Chunks start at each
    sequence's first step. Math in float32 (float64 for float64 inputs).
    Returns o [B, T, H, V], the final state [B|N, H, K, V] and the border states [B, H, n, K, V] (chunks of
    all sequences one after another with cu_seqlens): see `_run`. out_dtype / state_dtype: dtypes of o and of
    the border states (default: the compute dtype)."""
    if gr is not None and gr.shape[-1] == 1:  # a scalar decay commutes: carry it on the left
        gl, gr = (gr if gl is None else gl + gr), None
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    tr = lambda x: None if x is None else x.to(dt).transpose(1, 2)  # noqa: E731  [B, H, T, D]
    q, k, v, gl, gr = (tr(x) for x in (q, k, v, gl, gr))
    h0 = None if initial_state is None else initial_state.to(dt)
    if cu_seqlens is None:
        o, S, border = _run(q, k, v, gl, gr, scale, h0, chunk_size, reverse)
    else:
        bounds = host_values(cu_seqlens)  # once per tensor, so a CUDA graph capture can take a warmed call
        outs, finals, borders = [], [], []
        for n in range(len(bounds) - 1):
            s, e = bounds[n], bounds[n + 1]
            sl = lambda x: None if x is None else x[:, :, s:e]  # noqa: E731
            o, S, border = _run(sl(q), sl(k), sl(v), sl(gl), sl(gr), scale, None if h0 is None else h0[n:n + 1],
                                chunk_size, reverse)
            outs.append(o)
            finals.append(S)
            borders.append(border)
        o, S, border = torch.cat(outs, 2), torch.cat(finals, 0), torch.cat(borders, 2)
    return o.transpose(1, 2).to(out_dtype or dt), S, border.to(state_dtype or dt)


# Accuracy of the decay gradients (see autograd.py): backward passes in chunks of at most 32 steps when
# decay gradients are needed, and the dQ, dK passes in float64 when a constant decay needs its gradient.
chunk_recurrence.decay_grad_chunk = 32
chunk_recurrence.constant_decay_grad_dtype = torch.float64
chunk_recurrence.computes_wide = True  # math in float32 whatever the inputs (gated keys stay wide: autograd.py)
