"""The public entry point `linear_attention`: checks, backend choice, autograd."""
import torch

from .autograd import LinearAttentionFunction
from .checks import check_linear_attention
from .chunk_torch import chunk_recurrence
from .reference import reference_linear_attention


def _chunk_fn(backend, device):
    if backend == "triton" or (backend == "auto" and device.type == "cuda"):
        try:
            from .triton import chunk_recurrence_triton
        except ImportError as e:
            if backend == "triton":
                raise RuntimeError(f"backend='triton' needs Triton kernels, which could not be loaded ({e}); "
                                   "use backend='torch'") from e
            return chunk_recurrence
        if device.type != "cuda" and backend == "triton":
            import os
            if os.environ.get("TRITON_INTERPRET") != "1":
                raise RuntimeError(f"backend='triton' needs CUDA tensors (got {device}); set TRITON_INTERPRET=1 "
                                   "before importing ula to run the kernels on the CPU, or use backend='torch'")
        return chunk_recurrence_triton
    return chunk_recurrence


def linear_attention(q, k, v, ld=None, rd=None, *, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, chunk_size=None, backend="auto", reverse=False):
    """Decayed linear attention, the recurrence of DESIGN §1:

        S_t = diag(exp ld_t) S_{t-1} diag(exp rd_t) + k_t v_tᵀ,    o_t = scale · S_tᵀ q_t

    q, k [B, T, H, K]; v [B, T, H, V]; ld None / [H] / [B, T, H] / [B, T, H, K] and rd None / [B, T, H, V]
    are log decays (float32, <= 0); initial_state [B, H, K, V] float32 ([N, H, K, V] with cu_seqlens, int
    [N + 1] offsets of N sequences packed along T with B == 1). scale defaults to K ** -0.5.
    reverse=True runs the recurrence from the end of each sequence to its start. chunk_size: a power of two
    from 16 to 1024, or None for the backend's choice (measured: see benchmarks/).
    Returns (o with the dtype of v, final state float32 or None). Differentiable in q, k, v, ld, rd and
    initial_state. backend: "auto" (Triton on CUDA, PyTorch elsewhere), "torch", "triton", "reference"."""
    check_linear_attention(q, k, v, ld, rd, scale, initial_state, cu_seqlens, chunk_size, backend)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if backend == "reference":
        o, S = reference_linear_attention(q, k, v, ld, rd, scale=scale, initial_state=initial_state,
                                          output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                          reverse=reverse)
        return o.to(device=v.device, dtype=v.dtype), (None if S is None else S.to(q.device, torch.float32))
    F = _chunk_fn(backend, q.device)
    chunk_size = chunk_size or getattr(F, "default_chunk", 64)
    return LinearAttentionFunction.apply(q, k, v, ld, rd, initial_state, scale, cu_seqlens, reverse,
                                         chunk_size, output_final_state, F)
