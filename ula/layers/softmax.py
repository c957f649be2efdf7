"""Softmax attention baseline (causal, PyTorch SDPA) with rotary position embeddings and a KV cache.

    q, k, v = W_q x, W_k x, W_v x  (RoPE on q, k),   o = softmax(q kᵀ / √D + causal mask) v,   y = W_o o
The state is the KV cache (k [B, H, L, D], v [B, H, L, D]) after rotation: it grows with L, unlike the
linear mixers. With cu_seqlens (B == 1 packed) attention stays inside each sequence, positions restart
per sequence, and no cache is returned (state must be None there).
`step_static` decodes from a preallocated KV cache instead (k, v [B, H, max_len, D], see `static_state`):
each token is written at its position in place and SDPA reads the first `bound` positions with a mask
hiding those after it, so a CUDA graph captured for one bound serves every position below it."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core import capture
from ..ops._common import PackedTokens
from ._base import Mixer, check_divisible, merge_heads, split_heads


def rope(x, pos, base):
    """Rotate-half rotary embedding. x [B, T, H, D], pos [T] or [B, T] (int)."""
    D = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
    ang = pos.to(torch.float32)[..., None] * inv          # [.., T, D/2]
    cos, sin = ang.cos(), ang.sin()
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]   # [B|1, T, 1, D/2]
    x1, x2 = x.float().chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class SoftmaxAttentionLayer(Mixer):
    def __init__(self, d_model, n_heads=4, *, rope_base=10000.0, use_rope=True, chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        check_divisible("d_model", d_model, n_heads)
        if use_rope and (d_model // n_heads) % 2:   # rotate-half RoPE pairs the two halves of each head
            raise ValueError(f"head dim d_model / n_heads = {d_model // n_heads} must be even for the rotary "
                             "embedding (RoPE; use_rope=False has none)")
        self.d_model, self.n_heads, self.rope_base, self.use_rope = d_model, n_heads, rope_base, use_rope
        self.chunk_size, self.backend = chunk_size, backend
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, state=None, cu_seqlens=None):
        B, T, _ = x.shape
        H = self.n_heads
        q, k, v = (split_heads(p(x), H) for p in (self.q_proj, self.k_proj, self.v_proj))
        L = 0 if state is None else state[0].shape[2]
        if cu_seqlens is not None:
            if state is not None:
                raise ValueError("SoftmaxAttentionLayer: a KV cache cannot be combined with cu_seqlens")
            packed = PackedTokens.of(cu_seqlens, T, x.device)  # each token's sequence and position
            seq, pos = packed.seq, packed.pos
            idx = torch.arange(T, device=x.device)
            mask = (seq[:, None] == seq[None, :]) & (idx[:, None] >= idx[None, :])
        else:
            pos = torch.arange(L, L + T, device=x.device)
            mask = None
        if self.use_rope:
            q, k = rope(q, pos, self.rope_base), rope(k, pos, self.rope_base)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # [B, H, T, D]
        if state is not None:
            k, v = torch.cat([state[0], k], 2), torch.cat([state[1], v], 2)
        if mask is not None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif L == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            i = torch.arange(T, device=x.device)[:, None] + L
            j = torch.arange(L + T, device=x.device)[None, :]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=j <= i)
        y = self.o_proj(merge_heads(o.transpose(1, 2)))
        return y, (None if cu_seqlens is not None else (k, v))

    def step(self, x, state=None):
        y, S = self.forward(x.unsqueeze(1), state)
        return y.squeeze(1), S

    # ---- static KV cache ----------------------------------------------------------------------------------
    uses_length = True

    def static_state(self, state, max_len):
        """Zeroed (k, v) [B, H, max_len, D] holding the cache `state` in its first positions."""
        k, v = state
        if k.shape[2] > max_len:
            raise ValueError(f"a KV cache of {k.shape[2]} positions does not fit a static cache of {max_len}")
        buffers = (k.new_zeros(*k.shape[:2], max_len, k.shape[3]), v.new_zeros(*v.shape[:2], max_len, v.shape[3]))
        self.load_static_state(buffers, state)
        return buffers

    def load_static_state(self, buffers, state):
        for buf, x in zip(buffers, state):
            if x.shape[2] > buf.shape[2] or x.shape[:2] != buf.shape[:2]:
                raise ValueError(f"a KV cache of shape {tuple(x.shape)} does not fit buffers {tuple(buf.shape)}")
            buf.zero_()   # positions after the prefix: masked, but finite (0 · NaN would leak through the mask)
            buf[:, :, :x.shape[2]].copy_(x)

    def _rope_inv(self, device):
        """RoPE's inverse frequencies (as `rope` computes them), kept per device: no work per step."""
        cached = getattr(self, "_rope_inv_cache", None)
        if cached is None or cached.device != device:
            D = self.d_model // self.n_heads
            cached = 1.0 / (self.rope_base ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
            if not capture.capturing():  # made in a capture, it would hold values only after a replay
                self._rope_inv_cache = cached
        return cached

    def step_static(self, x, buffers, pos, bound=None):
        """One token x [B, d] at position pos (int64 [1], on the device) -> y [B, d]; writes its k, v into the
        buffers at pos and attends to positions <= pos among the first `bound` (all when None)."""
        kc, vc = buffers
        H = self.n_heads
        q, k, v = (split_heads(p(x), H) for p in (self.q_proj, self.k_proj, self.v_proj))   # [B, H, D]
        if self.use_rope:   # rope of q and k together (the formula of `rope`, one pass)
            ang = pos.to(torch.float32)[:, None] * self._rope_inv(x.device)                # [1, D/2]
            cos, sin = ang.cos(), ang.sin()
            x1, x2 = torch.stack([q, k]).float().chunk(2, -1)
            q, k = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype).unbind(0)
        kc.index_copy_(2, pos, k.unsqueeze(2))
        vc.index_copy_(2, pos, v.unsqueeze(2))
        n = kc.shape[2] if bound is None else bound
        mask = (torch.arange(n, device=x.device) <= pos).view(1, 1, 1, n)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kc[:, :, :n], vc[:, :, :n], attn_mask=mask)
        return self.o_proj(merge_heads(o.squeeze(2)))
