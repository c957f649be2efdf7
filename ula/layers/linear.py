"""Linear attention (Katharopoulos et al.; paper 000, Table 2, first row): no decay.

    q, k = φ(W_q x), φ(W_k x),  v = W_v x,   S_t = S_{t-1} + k_t v_tᵀ,   o_t = scale · S_tᵀ q_t
    y = W_o concat(NORM(o^1), ..., NORM(o^H))
φ is elu + 1 (Katharopoulos et al.) by default ("identity" and "relu" are there too). Instead of the
running denominator (that is the `normalized` layer, paper 001), each head's output goes through an
RMSNorm, which keeps the unnormalized sums at a usable scale."""
import torch.nn as nn
import torch.nn.functional as F

from ..ops import linear_attn, linear_attn_step
from ._base import Mixer, check_divisible, head_norm, merge_heads, split_heads

FEATURE_MAPS = {"elu": lambda x: F.elu(x) + 1.0, "relu": F.relu, "identity": lambda x: x}


class LinearAttentionLayer(Mixer):
    def __init__(self, d_model, n_heads=4, *, feature_map="elu", norm="rmsnorm", norm_eps=1e-6, scale=None,
                 chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        check_divisible("d_model", d_model, n_heads)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {sorted(FEATURE_MAPS)}, got {feature_map!r}")
        self.d_model, self.n_heads, self.feature_map = d_model, n_heads, feature_map
        self.scale, self.chunk_size, self.backend = scale, chunk_size, backend
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_norm = head_norm(norm, d_model // n_heads, norm_eps)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def _inputs(self, x):
        phi, H = FEATURE_MAPS[self.feature_map], self.n_heads
        return (split_heads(phi(self.q_proj(x)), H), split_heads(phi(self.k_proj(x)), H),
                split_heads(self.v_proj(x), H))

    def _output(self, o):
        return self.o_proj(merge_heads(self.o_norm(o)))

    def forward(self, x, state=None, cu_seqlens=None):
        q, k, v = self._inputs(x)
        o, S = linear_attn(q, k, v, scale=self.scale, initial_state=state, **self._kw(cu_seqlens))
        return self._output(o), S

    def step(self, x, state=None):
        q, k, v = self._inputs(x)
        o, S = linear_attn_step(q, k, v, state, scale=self.scale)
        return self._output(o), S
