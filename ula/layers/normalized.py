"""Normalized linear attention (paper 001): kernel f(x) = a + b x with its running denominator.

    o_i = Σ_{n<=i} (a + b q_i·k_n) v_n / Σ_{n<=i} (a + b q_i·k_n),   q, k L2-normalized per row (Eq. 22)
    y = W_o concat(o^1, ..., o^H)
a, b are per-head parameters when learnable_ab=True (initialised to a_init, b_init), fixed numbers
otherwise (the paper's kernels use a = b = 1, f(x) = 1 + x). The state, [B, H, d+1, d+1]
(Σ k vᵀ, Σ k, Σ v, count), does not depend on a or b."""
import torch
import torch.nn as nn

from ..ops import normalized_linear_attention, normalized_linear_attention_step
from ._base import Mixer, check_divisible, merge_heads, split_heads


class NormalizedLinearAttentionLayer(Mixer):
    def __init__(self, d_model, n_heads=4, *, a_init=1.0, b_init=1.0, learnable_ab=False, qk_l2_norm=True, eps=1e-6,
                 chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        check_divisible("d_model", d_model, n_heads)
        self.d_model, self.n_heads, self.qk_l2_norm, self.eps = d_model, n_heads, qk_l2_norm, eps
        self.chunk_size, self.backend = chunk_size, backend
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.learnable_ab = learnable_ab
        if learnable_ab:
            self.a = nn.Parameter(torch.full((n_heads,), float(a_init)))
            self.b = nn.Parameter(torch.full((n_heads,), float(b_init)))
        else:
            self.a, self.b = float(a_init), float(b_init)

    def _inputs(self, x):
        H = self.n_heads
        return (split_heads(self.q_proj(x), H), split_heads(self.k_proj(x), H), split_heads(self.v_proj(x), H))

    def forward(self, x, state=None, cu_seqlens=None):
        q, k, v = self._inputs(x)
        o, S = normalized_linear_attention(q, k, v, self.a, self.b, qk_l2_norm=self.qk_l2_norm, eps=self.eps,
                                           initial_state=state, **self._kw(cu_seqlens))
        return self.o_proj(merge_heads(o)), S

    def _ab_step(self, like):
        """a, b for a decoding step; fixed ones as tensors kept per device and dtype (the op would copy each
        number from the host at every step, which a CUDA graph cannot capture)."""
        if self.learnable_ab or torch.compiler.is_compiling():
            return self.a, self.b
        cached = getattr(self, "_ab_cache", None)
        if cached is None or cached[0].device != like.device or cached[0].dtype != like.dtype:
            cached = self._ab_cache = tuple(torch.tensor(c, dtype=like.dtype, device=like.device)
                                            for c in (self.a, self.b))
        return cached

    def step(self, x, state=None):
        q, k, v = self._inputs(x)
        a, b = self._ab_step(q)
        o, S = normalized_linear_attention_step(q, k, v, a, b, state, qk_l2_norm=self.qk_l2_norm, eps=self.eps)
        return self.o_proj(merge_heads(o)), S
