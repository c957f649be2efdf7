"""One-line families of paper 000, Table 2, each a single call of the core:

| op | key | left decay | models |
| --- | --- | --- | --- |
| `linear_attn` | k | none | linear attention (Katharopoulos et al.) |
| `retention` | k | constant λ per head, `[H]` | RetNet, TNL / Lightning Attention |
| `mamba2` | Δ_t B_t | scalar exp(Δ_t A) | Mamba2 (SSD, without the D skip) |
| `hgrn2` | 1 − λ_t | vector λ_t | HGRN2, MetaLA |

GLA (vector decay) is `ula.gla`, mLSTM / xLSTM (scalar decay) is `ula.mlstm`.
Every op returns (o, final state) and has a `*_step` twin for decoding one token at a time; the keyword arguments
initial_state, output_final_state, cu_seqlens, chunk_size, backend (and scale) are those of `ula.linear_attention`."""

import torch

from ..core import linear_attention
from ._checks import check_float, check_sequence, check_step_qkv, check_step_state
from ._common import _step, decay_dtype



def linear_attn(q, k, v, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                chunk_size=None, backend="auto"):
    """Plain (unnormalized) causal linear attention: S_t = S_{t-1} + k_t v_tᵀ, o_t = scale · S_tᵀ q_t."""
    check_sequence(q, k, v, cu_seqlens, chunk_size, backend, scale)
    return linear_attention(q, k, v, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend)


def retnet_log_decay(H, device=None, dtype=torch.float32):
    """RetNet's fixed per-head decays γ_h = 1 − 2^(−5−h), as log decays [H] (float32, or the dtype given)."""
    if isinstance(H, bool) or not isinstance(H, int) or H < 1:
        raise ValueError(f"retnet_log_decay: H (number of heads) must be an int >= 1, got {H!r}")
    # made on the device: a tensor from host values is a copy that waits for the GPU's queue
    h = torch.arange(H, dtype=torch.float64, device=device)
    return torch.log1p(-torch.exp2(-5 - h)).to(dtype)


def retention(q, k, v, ld=None, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
              chunk_size=None, backend="auto"):
    """Constant decay per head (RetNet, TNL): S_t = λ S_{t-1} + k_t v_tᵀ, o_t = scale · S_tᵀ q_t.
    ld = log λ [H] (<= 0; learnable: its gradient is returned); None uses RetNet's 1 − 2^(−5−h)."""
    check_sequence(q, k, v, cu_seqlens, chunk_size, backend, scale)
    if ld is not None:
        check_float("retention", "ld", ld, (q.shape[2],), "[H] (log decay per head)", device=q.device,
                    log_gate=True)
    if ld is None:
        ld = retnet_log_decay(q.shape[2], q.device, decay_dtype(q))
    return linear_attention(q, k, v, ld.to(decay_dtype(q)), scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend)


def _check_mamba2(op, dt, A, dt_shape, dt_what, device):
    check_float(op, "dt", dt, dt_shape, dt_what + " (step sizes, after softplus)", device=device, nonneg=True)
    check_float(op, "A", A, (dt_shape[-1],), "[H] (A <= 0)", device=device, nonpos=True)


def _mamba2_inputs(k, dt, A):
    ld = dt.to(decay_dtype(k)) * A.to(decay_dtype(k))
    return (k * dt.unsqueeze(-1).to(k.dtype)), ld


def mamba2(q, k, v, dt, A, *, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None,
           chunk_size=None, backend="auto"):
    """Mamba2-style scalar decay (SSD): h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_tᵀ, y_t = h_tᵀ C_t,
    with q = C, k = B, v = x. dt = Δ [B, T, H] (>= 0, already through softplus), A [H] (<= 0; 0: no decay).
    scale defaults to 1 (Mamba2 has none). The D·x skip connection is left to the layer."""
    check_sequence(q, k, v, cu_seqlens, chunk_size, backend, scale)
    _check_mamba2("mamba2", dt, A, q.shape[:3], "[B, T, H]", q.device)
    kk, ld = _mamba2_inputs(k, dt, A)
    return linear_attention(q, kk, v, ld, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend)


def hgrn2(q, v, g, *, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None,
          chunk_size=None, backend="auto"):
    """HGRN2: S_t = Diag(λ_t) S_{t-1} + (1 − λ_t) v_tᵀ, o_t = scale · S_tᵀ q_t, with g = log λ_t
    [B, T, H, K] (<= 0) and the key tied to the forget gate, k = 1 − λ (computed as −expm1(g)).
    scale defaults to 1."""
    check_sequence(q, q, v, cu_seqlens, chunk_size, backend, scale)
    check_float("hgrn2", "g", g, q.shape, "[B, T, H, K] (log forget gate, the shape of q)", device=q.device,
                log_gate=True)
    g = g.to(decay_dtype(q))
    return linear_attention(q, (-torch.expm1(g)).to(q.dtype), v, g, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend)


def linear_attn_step(q, k, v, state=None, *, scale=None):
    """One decoding step of `linear_attn`: q, k [B, H, K], v [B, H, V]."""
    check_step_qkv("linear_attn_step", q, k, v, scale=scale)
    check_step_state("linear_attn_step", state, q.shape + v.shape[-1:], device=q.device)
    return _step(q, k, v, None, None, state, scale)


def retention_step(q, k, v, ld=None, state=None, *, scale=None):
    """One decoding step of `retention` (ld [H], None for RetNet's decays)."""
    check_step_qkv("retention_step", q, k, v, scale=scale)
    check_step_state("retention_step", state, q.shape + v.shape[-1:], device=q.device)
    if ld is None:
        ld = retnet_log_decay(q.shape[1], q.device, decay_dtype(q))
    check_float("retention_step", "ld", ld, (q.shape[1],), "[H] (log decay per head)", device=q.device)
    return _step(q, k, v, ld, None, state, scale)


def mamba2_step(q, k, v, dt, A, state=None, *, scale=1.0):
    """One decoding step of `mamba2`: q = C, k = B [B, H, N], v = x [B, H, P], dt [B, H], A [H]."""
    check_step_qkv("mamba2_step", q, k, v, scale=scale)
    check_step_state("mamba2_step", state, q.shape + v.shape[-1:], "[B, H, N, P]", device=q.device)
    check_float("mamba2_step", "dt", dt, q.shape[:2], "[B, H] (step sizes, after softplus)", device=q.device)
    check_float("mamba2_step", "A", A, q.shape[1:2], "[H] (A <= 0)", device=q.device)
    kk, ld = _mamba2_inputs(k, dt, A)
    return _step(q, kk, v, ld, None, state, scale)


def hgrn2_step(q, v, g, state=None, *, scale=1.0):
    """One decoding step of `hgrn2`: q, g [B, H, K], v [B, H, V]."""
    check_step_qkv("hgrn2_step", q, q, v, scale=scale)
    check_step_state("hgrn2_step", state, q.shape + v.shape[-1:], device=q.device)
    check_float("hgrn2_step", "g", g, q.shape, "[B, H, K] (log forget gate, the shape of q)", device=q.device)
    return _step(q, (-torch.expm1(g.to(decay_dtype(q)))).to(q.dtype), v, g, None, state, scale)
