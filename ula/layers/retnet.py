"""Retention with a constant per-head decay (RetNet, TNL / Lightning Attention; paper 000, Table 2).

    S_t = λ_h S_{t-1} + k_t v_tᵀ,   o_t = scale · S_tᵀ q_t
    y = W_o (Swish(W_g x) ⊙ concat(GroupNorm(o^1), ..., GroupNorm(o^H)))      (RetNet's gated output)
λ_h = 1 − 2^(−5−h) (RetNet) by default, fixed; learn_decay=True makes log λ_h = logsigmoid(θ_h) a
parameter (the core returns the gradient of a constant decay). The per-head GroupNorm is an RMSNorm
over the head dim here. RetNet's xPos rotation of q and k is not included."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core import capture
from ..ops import retention, retention_step, retnet_log_decay
from ..ops._common import decay_dtype
from ._base import Mixer, check_divisible, head_norm, merge_heads, split_heads, swish, wide


class RetNetLayer(Mixer):
    def __init__(self, d_model, n_heads=4, *, expand_v=1.0, learn_decay=False, norm="rmsnorm", norm_eps=1e-6,
                 scale=None, chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        self.d_model, self.n_heads, self.d_v = d_model, n_heads, int(d_model * expand_v)
        check_divisible("d_model", d_model, n_heads)
        check_divisible("d_v", self.d_v, n_heads)
        self.scale, self.chunk_size, self.backend = scale, chunk_size, backend
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, self.d_v, bias=False)
        self.g_proj = nn.Linear(d_model, self.d_v, bias=False)
        self.o_norm = head_norm(norm, self.d_v // n_heads, norm_eps)
        self.o_proj = nn.Linear(self.d_v, d_model, bias=False)
        if learn_decay:   # logsigmoid(θ) = log λ  <=>  θ = log λ − log(1 − λ)
            ld = retnet_log_decay(n_heads)
            self.decay_logit = nn.Parameter(ld - torch.log(-torch.expm1(ld)))
        self.learn_decay = learn_decay

    def _ld(self, x):
        if self.learn_decay:
            return F.logsigmoid(wide(self.decay_logit))
        # fixed: nothing to store or load; kept per device (no host-to-device copy per decoding step)
        dt = decay_dtype(x)
        if torch.compiler.is_compiling():
            return retnet_log_decay(self.n_heads, x.device, dt)
        cached = getattr(self, "_ld_cache", None)
        if cached is None or cached.device != x.device or cached.dtype != dt:
            cached = retnet_log_decay(self.n_heads, x.device, dt)
            if not capture.capturing():  # made in a capture, it would hold values only after a replay
                self._ld_cache = cached
        return cached

    def _inputs(self, x):
        H = self.n_heads
        return (split_heads(self.q_proj(x), H), split_heads(self.k_proj(x), H), split_heads(self.v_proj(x), H))

    def _output(self, o, x):
        return self.o_proj(swish(self.g_proj(x)) * merge_heads(self.o_norm(o)))

    def forward(self, x, state=None, cu_seqlens=None):
        q, k, v = self._inputs(x)
        o, S = retention(q, k, v, self._ld(x), scale=self.scale, initial_state=state, **self._kw(cu_seqlens))
        return self._output(o, x), S

    def step(self, x, state=None):
        q, k, v = self._inputs(x)
        o, S = retention_step(q, k, v, self._ld(x), state, scale=self.scale)
        return self._output(o, x), S
