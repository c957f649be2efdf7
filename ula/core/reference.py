"""The recurrence of DESIGN §1, step by step in float64: the spec every fast path is tested against.

    S_t = diag(λ_t) S_{t-1} diag(γ_t) + k_t v_tᵀ,     o_t = scale · S_tᵀ q_t

Reverse runs from the end: S_t = diag(λ_{t+1}) S_{t+1} diag(γ_{t+1}) + k_t v_tᵀ (the decay of step t+1
links t+1 to t), and the returned final state is diag(λ_1) S_1 diag(γ_1).
Autograd through these plain ops gives the reference gradients.
"""
import torch

from .checks import check_linear_attention


def _expand(x, B, T, H, D):
    """Log decay of any accepted shape -> float64 [B, T, H, D]."""
    if x is None:
        return torch.zeros(B, T, H, D, dtype=torch.float64)
    x = x.double().cpu()
    if x.dim() == 1:  # constant [H]
        return x.view(1, 1, H, 1).expand(B, T, H, D)
    if x.dim() == 3:  # scalar [B, T, H]
        return x.unsqueeze(-1).expand(B, T, H, D)
    return x  # vector [B, T, H, D]


def _one_sequence(q, k, v, ld, rd, S, reverse):
    """q, k [T, H, K], v [T, H, V], ld [T, H, K], rd [T, H, V], S [H, K, V] -> o [T, H, V], final S."""
    T = q.shape[0]
    lam, gam = ld.exp(), rd.exp()
    one_k, one_v = torch.ones_like(lam[:1]), torch.ones_like(gam[:1])
    if reverse:  # step t uses the decay of t+1; nothing beyond the end
        lam, gam = torch.cat([lam[1:], one_k]), torch.cat([gam[1:], one_v])
    outs = [None] * T
    for t in (reversed(range(T)) if reverse else range(T)):
        S = lam[t].unsqueeze(-1) * S * gam[t].unsqueeze(-2) + k[t].unsqueeze(-1) * v[t].unsqueeze(-2)
        outs[t] = torch.einsum("hk,hkv->hv", q[t], S)
    if reverse and T > 0:
        S = ld[0].exp().unsqueeze(-1) * S * rd[0].exp().unsqueeze(-2)
    return torch.stack(outs), S


def reference_linear_attention(q, k, v, ld=None, rd=None, *, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None, reverse=False):
    """Float64 step-by-step recurrence on the CPU. The arguments and layout of `ula.linear_attention`, checked the
    same way, except key_gate (fold it into k: k · exp(key_gate)), chunk_size, backend, cp_group and precision.

    Returns (o float64 [B, T, H, V], final state float64 [B or N, H, K, V] or None)."""
    check_linear_attention(q, k, v, ld, rd, scale, initial_state, cu_seqlens, None, "reference")
    return recurrence(q, k, v, ld, rd, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                      cu_seqlens=cu_seqlens, reverse=reverse)


def recurrence(q, k, v, ld=None, rd=None, *, scale=None, initial_state=None, output_final_state=False,
               cu_seqlens=None, reverse=False):
    """reference_linear_attention without its checks, for the reference backend (ula/core/api.py), which checks the
    call itself and then folds a key gate into k (k may then be wider than q)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q, k, v = (x.double().cpu() for x in (q, k, v))
    ld, rd = _expand(ld, B, T, H, K), _expand(rd, B, T, H, V)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        c = cu_seqlens.tolist()
        spans = [(0, c[n], c[n + 1]) for n in range(len(c) - 1)]
    outs, finals = torch.zeros(B, T, H, V, dtype=torch.float64), []
    for n, (b, s, e) in enumerate(spans):
        S0 = torch.zeros(H, K, V, dtype=torch.float64) if initial_state is None else initial_state[n].double().cpu()
        o, S = _one_sequence(q[b, s:e], k[b, s:e], v[b, s:e], ld[b, s:e], rd[b, s:e], S0, reverse)
        outs[b, s:e] = o
        finals.append(S)
    return outs * scale, (torch.stack(finals) if output_final_state else None)
