"""The GLA layer (paper 002, §4.4).

Per head h:  S_t = Diag(α_t) S_{t-1} + k_tᵀ v_t,   o_t = q_t S_t
    o'_t = concat(LN(o_t^1), ..., LN(o_t^H)),   r_t = Swish(x_t W_r + b_r),   y_t = (r_t ⊙ o'_t) W_O
with the low-rank forget gate α_t = σ(x_t W_α¹ W_α² + b_α)^(1/τ) (W_α¹ d×16, W_α² 16×d_k, τ = 16),
i.e. log α = logsigmoid(x W_α¹ W_α² + b_α) / τ, and d_k = d/2, d_v = d (full-rank W_Q, W_K, W_V, W_O, W_r).
`scale` multiplies q·S (the paper has none; its per-head LayerNorm makes the output nearly invariant
to it); the default d_k'^(-1/2) keeps pre-norm values O(1).
Gate biases (the paper has b_r and b_α but gives no initial values; `CausalLM.reset_parameters` zeroes
biases, then calls `reset_gate_biases`): b_r starts at 2, so the output gate starts open (for a
unit-normal W_r x, Swish(2 + W_r x) averages 1.8 against 0.2 for Swish(W_r x)); b_α starts at 4, so
α ≈ σ(4)^(1/16) ≈ 0.999, the slow forgetting that τ is there to encourage, from the first step.
Measured with the `ula demo` defaults of commit d43ba8f (plain MQAR, 8 pairs, T 32, d_model 64, 1500 steps,
CPU), seeds 0 / 1: zero biases 33.0 % / 99.9 % (seed 0 stays on the loss plateau), these biases 100.0 % /
100.0 %."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import gla, gla_step
from ._base import Mixer, check_divisible, head_norm, merge_heads, split_heads, swish, wide


class GLALayer(Mixer):
    context_parallel = True  # ula.ops.gla takes a cp_group

    def __init__(self, d_model, n_heads=4, *, expand_k=0.5, expand_v=1.0, gate_rank=16, tau=16.0,
                 norm="layernorm", norm_eps=1e-5, scale=None, rgate_bias_init=2.0, fgate_bias_init=4.0,
                 chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        self.d_model, self.n_heads, self.tau = d_model, n_heads, float(tau)
        self.d_k, self.d_v = int(d_model * expand_k), int(d_model * expand_v)
        check_divisible("d_k", self.d_k, n_heads, f"int(d_model · expand_k) = int({d_model} · {expand_k})")
        check_divisible("d_v", self.d_v, n_heads, f"int(d_model · expand_v) = int({d_model} · {expand_v})")
        self.scale, self.chunk_size, self.backend = scale, chunk_size, backend
        self.q_proj = nn.Linear(d_model, self.d_k, bias=False)
        self.k_proj = nn.Linear(d_model, self.d_k, bias=False)
        self.v_proj = nn.Linear(d_model, self.d_v, bias=False)
        self.gk_down = nn.Linear(d_model, gate_rank, bias=False)   # W_α¹
        self.gk_up = nn.Linear(gate_rank, self.d_k, bias=True)     # W_α², b_α
        self.r_proj = nn.Linear(d_model, self.d_v, bias=True)      # W_r, b_r
        self.o_norm = head_norm(norm, self.d_v // n_heads, norm_eps)
        self.o_proj = nn.Linear(self.d_v, d_model, bias=False)
        self.rgate_bias_init, self.fgate_bias_init = rgate_bias_init, fgate_bias_init
        self.reset_gate_biases()

    @torch.no_grad()
    def reset_gate_biases(self):
        self.r_proj.bias.fill_(self.rgate_bias_init)
        self.gk_up.bias.fill_(self.fgate_bias_init)

    def _inputs(self, x):
        H = self.n_heads
        q = split_heads(self.q_proj(x), H)
        k = split_heads(self.k_proj(x), H)
        v = split_heads(self.v_proj(x), H)
        g = split_heads(F.logsigmoid(wide(self.gk_up(self.gk_down(x)))) / self.tau, H)
        return q, k, v, g

    def _output(self, o, x):
        o = merge_heads(self.o_norm(o))
        return self.o_proj(swish(self.r_proj(x)) * o)

    def forward(self, x, state=None, cu_seqlens=None):
        q, k, v, g = self._inputs(x)
        o, S = gla(q, k, v, g, scale=self.scale, initial_state=state, **self._kw(cu_seqlens))
        return self._output(o, x), S

    def step(self, x, state=None):
        q, k, v, g = self._inputs(x)
        o, S = gla_step(q, k, v, g, state, scale=self.scale)
        return self._output(o, x), S
