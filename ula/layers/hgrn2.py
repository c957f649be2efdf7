"""HGRN2 (paper 000, Table 2): the forget gate ties the key, k_t = 1 − λ_t.

    λ_t = β + (1 − β) σ(W_f x_t)   (β = lower_bound, 0 by default)
    S_t = Diag(λ_t) S_{t-1} + (1 − λ_t) v_tᵀ,   o_t = S_tᵀ q_t,   q = Swish(W_q x),  v = W_v x
    y = W_o (Swish(W_g x) ⊙ concat(NORM(o^1), ..., NORM(o^H)))
Per-head key dim d_k / H (the state expansion), d_k = expand_k · d. No scale on q (as in the op)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import hgrn2, hgrn2_step
from ._base import Mixer, check_divisible, head_norm, merge_heads, split_heads, swish, wide


class HGRN2Layer(Mixer):
    def __init__(self, d_model, n_heads=4, *, expand_k=0.5, lower_bound=0.0, norm="rmsnorm", norm_eps=1e-6,
                 scale=1.0, chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, int(d_model * expand_k)
        check_divisible("d_k", self.d_k, n_heads, f"int(d_model · expand_k) = int({d_model} · {expand_k})")
        check_divisible("d_model", d_model, n_heads)
        if not 0.0 <= lower_bound < 1.0:
            raise ValueError(f"lower_bound must be in [0, 1), got {lower_bound}")
        self.lower_bound, self.scale, self.chunk_size, self.backend = float(lower_bound), scale, chunk_size, backend
        self.q_proj = nn.Linear(d_model, self.d_k, bias=False)
        self.f_proj = nn.Linear(d_model, self.d_k, bias=True)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.g_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_norm = head_norm(norm, d_model // n_heads, norm_eps)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def _inputs(self, x):
        H = self.n_heads
        f = wide(self.f_proj(x))
        if self.lower_bound == 0.0:
            g = F.logsigmoid(f)
        else:   # log(β + (1 − β) σ(f)) = logaddexp(log β, log(1 − β) + logσ(f))
            beta = self.lower_bound
            g = torch.logaddexp(torch.full_like(f, math.log(beta)), math.log1p(-beta) + F.logsigmoid(f))
        return split_heads(swish(self.q_proj(x)), H), split_heads(self.v_proj(x), H), split_heads(g, H)

    def _output(self, o, x):
        return self.o_proj(swish(self.g_proj(x)) * merge_heads(self.o_norm(o)))

    def forward(self, x, state=None, cu_seqlens=None):
        q, v, g = self._inputs(x)
        o, S = hgrn2(q, v, g, scale=self.scale, initial_state=state, **self._kw(cu_seqlens))
        return self._output(o, x), S

    def step(self, x, state=None):
        q, v, g = self._inputs(x)
        o, S = hgrn2_step(q, v, g, state, scale=self.scale)
        return self._output(o, x), S
