"""One-line families of paper 000, Table 2, each a single call of the core:

| op | key | left decay | models |
| --- | --- | --- | --- |
| `linear_attn` | k | none | linear attention (Katharopoulos et al.) |
| `retention` | k | constant λ per head, `[H]` | RetNet, TNL / Lightning Attention |
| `mamba2` | Δ_t B_t | scalar exp(Δ_t A) | Mamba2 (SSD, without the D skip) |
| `hgrn2` | 1 − λ_t | vector λ_t | HGRN2, MetaLA |

GLA (vector decay) is `ula.gla`, mLSTM / xLSTM (scalar decay) is `ula.mlstm`.
Every op returns (o, final state) and has a `*_step` twin for decoding one token at a time."""
import math

import torch

from ..core import linear_attention
from ._common import decay_dtype, recurrent_step



def linear_attn(q, k, v, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                chunk_size=64, backend="auto"):
    """Plain (unnormalized) causal linear attention: S_t = S_{t-1} + k_t v_tᵀ, o_t = scale · S_tᵀ q_t."""
    return linear_attention(q, k, v, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend)


def retnet_log_decay(H, device=None):
    """RetNet's fixed per-head decays γ_h = 1 − 2^(−5−h), as log decays [H] (float32)."""
    return torch.tensor([math.log1p(-2.0 ** (-5 - h)) for h in range(H)], dtype=torch.float32, device=device)


def retention(q, k, v, ld=None, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
              chunk_size=64, backend="auto"):
    """Constant decay per head (RetNet, TNL): S_t = λ S_{t-1} + k_t v_tᵀ, o_t = scale · S_tᵀ q_t.
    ld = log λ [H] (<= 0; learnable: its gradient is returned); None uses RetNet's 1 − 2^(−5−h)."""
    if ld is None:
        ld = retnet_log_decay(q.shape[2], q.device)
    return linear_attention(q, k, v, ld.to(decay_dtype(q)), scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend)


def _mamba2_inputs(k, dt, A):
    ld = dt.to(decay_dtype(k)) * A.to(decay_dtype(k))
    return (k * dt.unsqueeze(-1).to(k.dtype)), ld


def mamba2(q, k, v, dt, A, *, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None,
           chunk_size=64, backend="auto"):
    """Mamba2-style scalar decay (SSD): h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_tᵀ, y_t = h_tᵀ C_t,
    with q = C, k = B, v = x. dt = Δ [B, T, H] (>= 0, already through softplus), A [H] (< 0).
    scale defaults to 1 (Mamba2 has none). The D·x skip connection is left to the layer."""
    kk, ld = _mamba2_inputs(k, dt, A)
    return linear_attention(q, kk, v, ld, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend)


def hgrn2(q, v, g, *, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None,
          chunk_size=64, backend="auto"):
    """HGRN2: S_t = Diag(λ_t) S_{t-1} + (1 − λ_t) v_tᵀ, o_t = scale · S_tᵀ q_t, with g = log λ_t
    [B, T, H, K] (<= 0) and the key tied to the forget gate, k = 1 − λ (computed as −expm1(g)).
    scale defaults to 1."""
    g = g.to(decay_dtype(q))
    return linear_attention(q, (-torch.expm1(g)).to(q.dtype), v, g, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend)


def linear_attn_step(q, k, v, state=None, *, scale=None):
    """One decoding step of `linear_attn`: q, k [B, H, K], v [B, H, V]."""
    return recurrent_step(q, k, v, None, None, state, scale)


def retention_step(q, k, v, ld=None, state=None, *, scale=None):
    """One decoding step of `retention` (ld [H], None for RetNet's decays)."""
    if ld is None:
        ld = retnet_log_decay(q.shape[1], q.device)
    return recurrent_step(q, k, v, ld, None, state, scale)


def mamba2_step(q, k, v, dt, A, state=None, *, scale=1.0):
    """One decoding step of `mamba2`: q = C, k = B [B, H, N], v = x [B, H, P], dt [B, H], A [H]."""
    kk, ld = _mamba2_inputs(k, dt, A)
    return recurrent_step(q, kk, v, ld, None, state, scale)


def hgrn2_step(q, v, g, state=None, *, scale=1.0):
    """One decoding step of `hgrn2`: q, g [B, H, K], v [B, H, V]."""
    return recurrent_step(q, (-torch.expm1(g.to(decay_dtype(q)))).to(q.dtype), v, g, None, state, scale)
