"""The GSA layer (paper 004, §3.3, Eq. 7-9).

Per head h (H = 4 by default), with m memory slots (m = 64):
    q, k, v = Swish(W_q x), Swish(W_k x), Swish(W_v x)                                   (Eq. 8)
    α_t = σ(W_α x_t)^(1/τ), τ = 8   (log α = logsigmoid(W_α x) / τ, per head and slot)
    K̃_t = Diag(α_t) K̃_{t-1} + (1 − α_t) ⊗ k_t,   Ṽ_t = Diag(α_t) Ṽ_{t-1} + (1 − α_t) ⊗ v_t
    o_t = Ṽ_tᵀ softmax(scale · K̃_t q_t)                                                  (Eq. 6-7)
    y = W_o RMSNorm(Swish(concat(o^1, ..., o^H)))                                           (Eq. 9)
`scale` defaults to d_head^(-1/2) (Eq. 6 prints none: pass scale=1.0 for it literally).
The state is (K̃ᵀ [B, H, d_head, m], Ṽ [B, H, m, d_head]): its size is fixed by m, not by T.
W_α has a bias b_α here, starting at 3 (Eq. 8 prints none; `fgate_bias_init=None` leaves it out, as
printed): with none, α starts at σ(0)^(1/8) ≈ 0.92, so a slot keeps a token for about 12 steps; σ(3)^(1/8)
≈ 0.994 starts with the slow forgetting that τ is there to encourage. Measured with the `ula demo` defaults of
commit d43ba8f (plain MQAR, 8 pairs, T 32, d_model 64, 1500 steps, CPU), seeds 0 / 1: no bias 26.6 % / 28.3 %
(both on the loss plateau), b_α from 3 99.7 % / 98.9 %."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import gsa, gsa_step
from ._base import Mixer, RMSNorm, check_divisible, merge_heads, split_heads, swish, wide


class GSALayer(Mixer):
    def __init__(self, d_model, n_heads=4, *, num_slots=64, tau=8.0, norm_eps=1e-6, scale=None,
                 fgate_bias_init=3.0, chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        check_divisible("d_model", d_model, n_heads)
        self.d_model, self.n_heads, self.num_slots, self.tau = d_model, n_heads, num_slots, float(tau)
        self.scale, self.chunk_size, self.backend = scale, chunk_size, backend
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.f_proj = nn.Linear(d_model, n_heads * num_slots, bias=fgate_bias_init is not None)   # W_α, b_α
        self.o_norm = RMSNorm(d_model, eps=norm_eps)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.fgate_bias_init = fgate_bias_init
        self.reset_gate_biases()

    @torch.no_grad()
    def reset_gate_biases(self):
        if self.f_proj.bias is not None:
            self.f_proj.bias.fill_(self.fgate_bias_init)

    def _inputs(self, x):
        H = self.n_heads
        q = split_heads(swish(self.q_proj(x)), H)
        k = split_heads(swish(self.k_proj(x)), H)
        v = split_heads(swish(self.v_proj(x)), H)
        g = split_heads(F.logsigmoid(wide(self.f_proj(x))) / self.tau, H)
        return q, k, v, g

    def _output(self, o):
        return self.o_proj(self.o_norm(swish(merge_heads(o))))

    def forward(self, x, state=None, cu_seqlens=None):
        q, k, v, g = self._inputs(x)
        o, S = gsa(q, k, v, g=g, scale=self.scale, initial_state=state, **self._kw(cu_seqlens))
        return self._output(o), S

    def step(self, x, state=None):
        q, k, v, g = self._inputs(x)
        o, S = gsa_step(q, k, v, g=g, state=state, scale=self.scale)
        return self._output(o), S
