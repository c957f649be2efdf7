"""A Mamba2-style layer (SSD, scalar decay; paper 000, Table 2: q = C_t, k = B_t, v = x_t, l = exp(Δ_t A)).

    [z, x, B, C, Δ̃] = in_proj(u);   x, B, C = Swish(x), Swish(B), Swish(C)
    Δ = softplus(Δ̃ + Δ_bias) [per head],   A = −exp(A_log) [per head]
    h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_tᵀ,   y_t = h_tᵀ C_t + D ⊙ x_t
    out = out_proj(RMSNorm(y ⊙ Swish(z)))
One group of B, C (N = d_state) shared by all heads; head dim P = expand · d / H. Mamba2's short
causal convolution before the activation is not included (the layer is the SSD mixer alone)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import mamba2, mamba2_step
from ._base import Mixer, RMSNorm, check_divisible, merge_heads, split_heads, swish, wide


class Mamba2Layer(Mixer):
    def __init__(self, d_model, n_heads=4, *, expand=2, d_state=64, dt_min=1e-3, dt_max=0.1, A_init=(1.0, 16.0),
                 norm_eps=1e-6, chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        self.d_model, self.n_heads, self.d_state = d_model, n_heads, d_state
        self.d_inner = int(expand * d_model)
        check_divisible("d_inner", self.d_inner, n_heads, f"int(expand · d_model) = int({expand} · {d_model})")
        self.chunk_size, self.backend = chunk_size, backend
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * d_state + n_heads, bias=False)
        dt = torch.exp(torch.rand(n_heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))   # softplus⁻¹(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(n_heads).uniform_(*A_init)))
        self.D = nn.Parameter(torch.ones(n_heads))
        self.norm = RMSNorm(self.d_inner, eps=norm_eps)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def _inputs(self, u):
        H, N, E = self.n_heads, self.d_state, self.d_inner
        z, x, B, C, dt = self.in_proj(u).split([E, E, N, N, H], -1)
        x = split_heads(swish(x), H)
        B = swish(B).unsqueeze(-2).expand(*B.shape[:-1], H, N)
        C = swish(C).unsqueeze(-2).expand(*C.shape[:-1], H, N)
        dt = F.softplus(wide(dt) + wide(self.dt_bias))
        A = -torch.exp(wide(self.A_log))
        return z, x, B, C, dt, A

    def _output(self, y, x, z):
        y = y + self.D.to(y.dtype)[:, None] * x
        return self.out_proj(self.norm(merge_heads(y) * swish(z)))

    def forward(self, x, state=None, cu_seqlens=None):
        z, xh, B, C, dt, A = self._inputs(x)
        y, S = mamba2(C, B, xh, dt, A, initial_state=state, **self._kw(cu_seqlens))
        return self._output(y, xh, z), S

    def step(self, x, state=None):
        z, xh, B, C, dt, A = self._inputs(x)
        y, S = mamba2_step(C, B, xh, dt, A, state)
        return self._output(y, xh, z), S
