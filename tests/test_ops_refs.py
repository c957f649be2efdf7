"""Float64 references for the families, written step by step from each paper's recurrent equations (not
through ula.core), and the comparison used by every test_ops_* file: outputs, final states and the
gradients of every input (gates, a, b and initial states included) against autograd through the reference."""
import torch
import torch.nn.functional as F

from helpers import rel

TOL = 1e-4
SHAPE = dict(B=2, T=37, H=2, K=8, V=6)  # small, odd T, K != V
CHUNK = 16


# ---------------------------------------------------------------- references (float64, one step at a time)

def ref_gla(q, k, v, g, scale=None, h0=None):
    """GLA (paper 002): S_t = Diag(α_t) S_{t-1} + k_t v_tᵀ, α_t = exp(g_t); o_t = scale S_tᵀ q_t."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype, device=q.device) if h0 is None else h0
    out = []
    for t in range(T):
        S = g[:, t].exp()[..., None] * S + k[:, t, ..., None] * v[:, t, :, None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, 1), S


def ref_plain(q, k, v, scale=None, h0=None):
    """Linear attention (Katharopoulos): S_t = S_{t-1} + k_t v_tᵀ."""
    return ref_gla(q, k, v, torch.zeros_like(q), scale, h0)


def ref_retention(q, k, v, gamma, scale=None, h0=None):
    """RetNet / TNL: S_t = γ S_{t-1} + k_t v_tᵀ, γ [H] (not log)."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype, device=q.device) if h0 is None else h0
    out = []
    for t in range(T):
        S = gamma.view(1, H, 1, 1) * S + k[:, t, ..., None] * v[:, t, :, None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, 1), S


def ref_mamba2(C, Bm, x, dt, A, h0=None):
    """Mamba2 SSD: h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_tᵀ, y_t = h_tᵀ C_t."""
    B, T, H, N = C.shape
    h = torch.zeros(B, H, N, x.shape[-1], dtype=C.dtype, device=C.device) if h0 is None else h0
    out = []
    for t in range(T):
        h = torch.exp(dt[:, t] * A)[..., None, None] * h + dt[:, t, :, None, None] * Bm[:, t, ..., None] * x[:, t, :, None, :]
        out.append(torch.einsum("bhn,bhnp->bhp", C[:, t], h))
    return torch.stack(out, 1), h


def ref_hgrn2(q, v, g, scale=1.0, h0=None):
    """HGRN2: S_t = Diag(λ_t) S_{t-1} + (1 − λ_t) v_tᵀ, λ_t = exp(g_t)."""
    lam = g.exp()
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype, device=q.device) if h0 is None else h0
    out = []
    for t in range(T):
        S = lam[:, t, ..., None] * S + (1 - lam[:, t])[..., None] * v[:, t, :, None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, 1), S


def ref_mlstm_sig(q, k, v, i, f, scale=None, h0=None):
    """mLSTMsig (paper 003, Eq. 19-20): C_t = σ(f̃_t) C_{t-1} + σ(ĩ_t) k_t v_tᵀ, h̃_t = C_tᵀ q_t / sqrt(d)."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    C = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype, device=q.device) if h0 is None else h0
    out = []
    for t in range(T):
        C = torch.sigmoid(f[:, t])[..., None, None] * C \
            + torch.sigmoid(i[:, t])[..., None, None] * k[:, t, ..., None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", C, q[:, t] * scale))
    return torch.stack(out, 1), C


def ref_mlstm_exp(q, k, v, i, f, scale=None, eps=1e-6, h0=None):
    """mLSTMexp (paper 003, Eq. 1-4), max state m_0 = 0 without an initial state:
    m_t = max(logσ(f̃_t) + m_{t-1}, ĩ_t); f_t = exp(logσ(f̃_t) + m_{t-1} − m_t), i_t = exp(ĩ_t − m_t);
    C_t = f_t C_{t-1} + i_t k_t v_tᵀ; n_t = f_t n_{t-1} + i_t k_t;
    h̃_t = C_tᵀ q̂_t / (max(|n_tᵀ q̂_t|, exp(−m_t)) + eps), q̂ = q / sqrt(d)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if h0 is None:
        z = dict(dtype=q.dtype, device=q.device)
        C, n, m = torch.zeros(B, H, K, V, **z), torch.zeros(B, H, K, **z), torch.zeros(B, H, **z)
    else:
        C, n, m = h0
    out = []
    for t in range(T):
        lf = F.logsigmoid(f[:, t])
        m_new = torch.maximum(lf + m, i[:, t])
        fg, ig = torch.exp(lf + m - m_new), torch.exp(i[:, t] - m_new)
        C = fg[..., None, None] * C + ig[..., None, None] * k[:, t, ..., None] * v[:, t, :, None, :]
        n = fg[..., None] * n + ig[..., None] * k[:, t]
        m = m_new
        qs = q[:, t] * scale
        num = torch.einsum("bhkv,bhk->bhv", C, qs)
        den = torch.maximum((n * qs).sum(-1).abs(), torch.exp(-m)) + eps
        out.append(num / den[..., None])
    return torch.stack(out, 1), (C, n, m)


def ref_normalized(q, k, v, a, b, qk_l2_norm=True, h0=None, direct=False, eps=None):
    """Normalized linear attention (paper 001), recurrent form of Eq. 8-9 with f(x) = a + b x:
    x1 = Σ v, X2 = Σ k vᵀ, y1 = count, y2 = Σ k (a, b applied at the output, so the state is
    [[X2, y2], [x1ᵀ, y1]] = Σ [k; 1][v; 1]ᵀ); o_i = (a x1 + b X2ᵀ q_i) / (a y1 + b y2·q_i) (Eq. 5, 8).
    direct=True evaluates Eq. 4 as written instead (quadratic; no initial state). eps: the op's documented guard,
    the denominator's magnitude kept at least eps with its sign (0 counts as positive)."""
    if qk_l2_norm:  # Eq. 22, with F.normalize's guard: x / max(|x|, 1e-12), as the op documents
        q, k = (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12) for x in (q, k))
    B, T, H, K = q.shape
    V = v.shape[-1]
    a = torch.as_tensor(a, dtype=q.dtype, device=q.device).reshape(-1, 1)  # [H or 1, 1]
    b = torch.as_tensor(b, dtype=q.dtype, device=q.device).reshape(-1, 1)
    if direct:
        out = []
        for i in range(T):
            w = a.view(1, 1, -1) + b.view(1, 1, -1) * torch.einsum("bhk,bnhk->bnh", q[:, i], k[:, :i + 1])
            out.append((w[..., None] * v[:, :i + 1]).sum(1) / w.sum(1)[..., None])
        return torch.stack(out, 1), None
    S = torch.zeros(B, H, K + 1, V + 1, dtype=q.dtype, device=q.device) if h0 is None else h0
    X2, y2, x1, y1 = S[:, :, :K, :V], S[:, :, :K, V], S[:, :, K, :V], S[:, :, K, V]
    out = []
    for t in range(T):
        X2 = X2 + k[:, t, ..., None] * v[:, t, :, None, :]
        y2 = y2 + k[:, t]
        x1 = x1 + v[:, t]
        y1 = y1 + 1
        num = a * x1 + b * torch.einsum("bhkv,bhk->bhv", X2, q[:, t])
        den = a[:, 0] * y1 + b[:, 0] * (y2 * q[:, t]).sum(-1)
        if eps is not None:
            den = torch.where(den >= 0, den.clamp_min(eps), den.clamp_max(-eps))
        out.append(num / den[..., None])
    top = torch.cat([X2, y2[..., None]], -1)
    bottom = torch.cat([x1, y1[..., None]], -1)[:, :, None]
    return torch.stack(out, 1), torch.cat([top, bottom], 2)


def ref_gsa(q, k, v, s, g, scale=None, h0=None):
    """GSA (paper 004, Eq. 6), slots as rows: K̃_t = Diag(α_t) K̃_{t-1} + s_t ⊗ k_t, Ṽ likewise with v_t,
    o_t = Ṽ_tᵀ softmax(scale K̃_t q_t); α = exp(g) (g None: α = 1, ABC). Returns states (K̃ᵀ, Ṽ)."""
    B, T, H, K = q.shape
    m, V = s.shape[-1], v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if h0 is None:
        z = dict(dtype=q.dtype, device=q.device)
        Kt, Vt = torch.zeros(B, H, m, K, **z), torch.zeros(B, H, m, V, **z)
    else:
        Kt, Vt = h0[0].transpose(-1, -2), h0[1]
    out = []
    for t in range(T):
        alpha = torch.ones_like(s[:, t]) if g is None else g[:, t].exp()
        Kt = alpha[..., None] * Kt + s[:, t, ..., None] * k[:, t, :, None, :]
        Vt = alpha[..., None] * Vt + s[:, t, ..., None] * v[:, t, :, None, :]
        p = torch.softmax(scale * torch.einsum("bhmk,bhk->bhm", Kt, q[:, t]), -1)
        out.append(torch.einsum("bhmv,bhm->bhv", Vt, p))
    return torch.stack(out, 1), (Kt.transpose(-1, -2), Vt)


def ref_abc(q, k, v, w, scale=None, h0=None):
    """ABC (paper 004, Eq. 3-4): φ_t = exp(w_t) / Σ_{j<=t} exp(w_j); K̃_t = K̃_{t-1} + φ_t ⊗ k_t, ...
    The normalizer Σ exp(w) is kept as a float64 sum (not in log space) to stay literal."""
    z = torch.zeros_like(w[:, 0]) if h0 is None else h0[2].exp()
    phis = []
    for t in range(w.shape[1]):
        z = z + w[:, t].exp()
        phis.append(w[:, t].exp() / z)
    o, S = ref_gsa(q, k, v, torch.stack(phis, 1), None, scale, None if h0 is None else h0[:2])
    return o, S + (z.log(),)


# ---------------------------------------------------------------- comparison

def _map(fn, x):
    if isinstance(x, (tuple, list)):
        return tuple(_map(fn, y) for y in x)
    return None if x is None else fn(x)


def _flat(x):
    if x is None:
        return []
    if isinstance(x, (tuple, list)):
        return [z for y in x for z in _flat(y)]
    return [x]


def per_sequence(ref, cu, token_args, other_args, h0=None):
    """Run a batched reference on each packed sequence of cu_seqlens (B == 1) and pack the results."""
    c = cu.tolist()
    outs, states = [], []
    for n in range(len(c) - 1):
        sl = {name: x[:, c[n]:c[n + 1]] for name, x in token_args.items()}
        hn = _map(lambda s: s[n:n + 1], h0)
        o, S = ref(**sl, **other_args, h0=hn)
        outs.append(o)
        states.append(S)
    if isinstance(states[0], tuple):
        S = tuple(torch.cat([s[j] for s in states]) for j in range(len(states[0])))
    else:
        S = torch.cat(states)
    return torch.cat(outs, 1), S


def compare(op, ref, inputs, *, final=True, grad=True, ref_float32=False, floors=None):
    """op(**inputs) -> (o, state) in float32; ref(**inputs in float64) -> (o, state). inputs: name ->
    tensor, tuple of tensors, or a non-tensor. Returns {name: relative error} for o, every state part
    and the gradient of every floating input (through o and the final state, random cotangents).
    ref_float32: also run ref in float32 on the same cotangents and return (errors, errors of that float32
    recurrence): how ill-conditioned each quantity is on this draw. floors: {error name: the smallest reference
    norm an error is relative to} (a gradient that is all rounding-sized on a draw)."""
    def leaf(dt):
        def f(x):
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                return x.detach().to(dt if dt is not None else x.dtype).clone().requires_grad_(grad)
            return x
        return f

    def run(fn, dt):
        leaves = {n: _map(leaf(dt), x) for n, x in inputs.items()}
        o, S = fn(**leaves)
        return leaves, o, _flat(S) if final else []

    refs, o_r, S_r = run(ref, torch.float64)
    do = torch.randn_like(o_r)
    dS = [torch.randn_like(s_r) for s_r in S_r]
    loss_r = (o_r * do).sum() + sum((s_r * ds).sum() for s_r, ds in zip(S_r, dS))
    if grad:
        loss_r.backward()

    def errors(fn, dt):
        leaves, o, S = run(fn, dt)
        errs = {"o": rel(o, o_r)}
        loss = (o.double() * do).sum()
        for j, (s_, s_r, ds) in enumerate(zip(S, S_r, dS)):
            assert s_.shape == s_r.shape, f"state part {j}: {tuple(s_.shape)} vs reference {tuple(s_r.shape)}"
            errs[f"state{j}"] = rel(s_, s_r)
            loss = loss + (s_.double() * ds).sum()
        if grad:
            loss.backward()
            for n in inputs:
                for j, (a, b) in enumerate(zip(_flat(leaves[n]), _flat(refs[n]))):
                    if isinstance(a, torch.Tensor) and a.requires_grad:
                        assert a.grad is not None, f"no gradient for {n}"
                        name = f"d{n}{j if isinstance(leaves[n], tuple) else ''}"
                        errs[name] = rel(a.grad, b.grad, (floors or {}).get(name, 1e-30))
        return errs

    if ref_float32:
        return errors(op, None), errors(ref, torch.float32)
    return errors(op, None)


def check(errs, seed, tol=TOL):
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= tol}
    assert not bad, f"relative errors over {tol}: {bad} (seed {seed})"


def check_conditioned(errs, errs32, case, tol=TOL, loose=(), loose_tol=1e-3):
    """check() for compare(..., ref_float32=True): a quantity that the float32 recurrence itself misses by e (a draw
    where a sum over all steps cancels: the gradients of a and b, of a decay) may be missed by 10 e. `loose` names
    held to loose_tol; case: the seed or the drawn case, for the message."""
    bad = {k: f"{v:.2e} (float32 recurrence {errs32[k]:.2e})" for k, v in errs.items()
           if not v <= max(loose_tol if k in loose else tol, 10 * errs32[k])}
    assert not bad, f"relative errors over {tol}: {bad} for {case}"


def packed(lens):
    lens = torch.tensor(lens)
    return torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])


def rand_cu():
    """2-3 sequences of unequal lengths, total odd."""
    n = int(torch.randint(2, 4, ()))
    lens = torch.randint(3, 30, (n,))
    lens[0] = 17
    if int(lens.sum()) % 2 == 0:
        lens[-1] += 1
    return torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
