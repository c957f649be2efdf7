"""Which function fla's chunk_abc computes, against ours (CPU, float64): a step-by-step recurrence of the form in which
every earlier write is rescaled by the current normalizer (fla 0.6.0's fla/ops/abc/naive.py), against ula.gsa with
s = φ and g = z_{t−1} − z_t, and against ula.abc (paper 004 Eq. 3-4 as printed: each write normalized once).

    python3 benchmarks/cpu_abc_forms.py > benchmarks/cpu_abc_forms.txt"""
import torch

import ula

print(f"torch {torch.__version__}, CPU, float64")
torch.manual_seed(0)
B, T, H, K, V, M = 1, 37, 2, 8, 8, 4
q, k, v = (torch.randn(B, T, H, D, dtype=torch.float64) for D in (K, K, V))
s = torch.randn(B, T, H, M, dtype=torch.float64) * 2
z = s.logcumsumexp(1)
g = torch.cat([torch.zeros_like(z[:, :1]), z[:, :-1] - z[:, 1:]], 1)  # z_{t-1} - z_t (first step: the state is 0)
phi = (s - z).exp()
o_ula = ula.gsa(q, k, v, phi, g, backend="torch")[0]
# fla's form, step by step: every earlier write rescaled by the current normalizer
hk = torch.zeros(B, H, K, M, dtype=torch.float64)
hv = torch.zeros(B, H, M, V, dtype=torch.float64)
outs = []
for t in range(T):
    a = torch.exp((z[:, t - 1] - z[:, t]) if t > 0 else torch.zeros_like(z[:, 0]))  # [B, H, M]
    hk = hk * a[:, :, None, :] + k[:, t, :, :, None] * phi[:, t, :, None, :]
    ok = torch.einsum("bhk,bhkm->bhm", q[:, t] * K ** -0.5, hk).softmax(-1)
    hv = hv * a[:, :, :, None] + phi[:, t, :, :, None] * v[:, t, :, None, :]
    outs.append(torch.einsum("bhm,bhmv->bhv", ok, hv))
o_ref = torch.stack(outs, 1)
print("max |ula.gsa(s=phi, g=z_{t-1}-z_t) - fla-form recurrence|:", (o_ula - o_ref).abs().max().item())
o_abc = ula.abc(q, k, v, s, backend="torch")[0]
print("max |ula.abc - fla-form recurrence| (different math):", (o_abc - o_ref).abs().max().item())
