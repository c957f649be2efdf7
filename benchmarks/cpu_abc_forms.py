"""Which function fla's chunk_abc computes, against ours (CPU, float64): a step-by-step recurrence of the form in which
every earlier write is rescaled by the current normalizer (fla 0.6.0's fla/ops/abc/naive.py), against ula.gsa with
s = φ and g = z_{t−1} − z_t (ula.bench.families' "abc_fla_form", set against fla's chunk_abc), and against ula.abc
(paper 004 Eq. 3-4 as printed: each write normalized once).

    python3 benchmarks/cpu_abc_forms.py > benchmarks/cpu_abc_forms.txt"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402
from ula.bench import families  # noqa: E402


def fla_form(q, k, v, w, scale=None):
    """o [B, T, H, V] of ABC with every earlier write rescaled by the current normalizer, step by step:
    K̃_t = a_t K̃_{t−1} + k_t ⊗ φ_t, Ṽ_t = a_t Ṽ_{t−1} + φ_t ⊗ v_t, a_t = exp(z_{t−1} − z_t), φ_t = exp(w_t − z_t),
    o_t = Ṽ_tᵀ softmax(scale K̃_tᵀ q_t)."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    z = w.logcumsumexp(1)
    phi = (w - z).exp()
    hk = q.new_zeros(B, H, K, w.shape[-1])
    hv = q.new_zeros(B, H, w.shape[-1], v.shape[-1])
    outs = []
    for t in range(T):
        a = torch.exp(z[:, t - 1] - z[:, t]) if t > 0 else torch.ones_like(z[:, 0])  # [B, H, m]
        hk = hk * a[:, :, None, :] + k[:, t, :, :, None] * phi[:, t, :, None, :]
        p = torch.einsum("bhk,bhkm->bhm", q[:, t] * scale, hk).softmax(-1)
        hv = hv * a[:, :, :, None] + phi[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhm,bhmv->bhv", p, hv))
    return torch.stack(outs, 1)


def main():
    print(f"torch {torch.__version__}, CPU, float64")
    x = families.make("abc_fla_form", 1, 37, 2, 8, 8, "cpu", torch.float64, m=4)
    ref = fla_form(*(x[n].detach() for n in ("q", "k", "v", "w")))
    ours_fla = families.ours("abc_fla_form", backend="torch")(x).detach()
    abc = ula.abc(x["q"], x["k"], x["v"], x["w"], backend="torch")[0].detach()
    print(f"max |ula.gsa(s=φ, g=log(1 - φ) = z_(t-1) - z_t) - fla's form|: {(ours_fla - ref).abs().max().item():.2e}")
    print(f"max |ula.abc - fla's form| (other math): {(abc - ref).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
