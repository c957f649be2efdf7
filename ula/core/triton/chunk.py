"""chunk_recurrence_triton: F(q, k, v, L, R, reverse) of DESIGN §2 on the three kernels (cumsum, state, output).

Same contract as ula.core.chunk_torch.chunk_recurrence. Reverse and varlen are native: the kernels walk the
chunks backward and read the sequence bounds themselves (no flipped or padded copies of q, k, v)."""
import torch

from ..chunk_layout import make_layout
from .cumsum import chunk_cumsum
from .decay_grad import log_decay_grad_triton
from .output import chunk_output
from .state import chunk_states
from .utils import DOT_TF32, dot_code, part_dot, state_dot


def _final_decay(S, gl, gr, cu_seqlens, floor=None):
    """A reverse pass leaves through each sequence's first step, which decays the state once more (its log decay
    floored at `floor` where given: only those steps are read)."""
    first = 0 if cu_seqlens is None else cu_seqlens[:-1].to(device=S.device, dtype=torch.long)
    for g, side in ((gl, -1), (gr, -2)):
        if g is not None:
            g = g[:, first] if cu_seqlens is None else g[0, first]  # [B|1 or N, H, K|1 or V]
            S = S * (g.float() if floor is None else g.float().clamp_min(floor)).exp().unsqueeze(side)
    return S


def chunk_recurrence_triton(q, k, v, gl=None, gr=None, *, scale=1.0, initial_state=None, cu_seqlens=None,
                            reverse=False, chunk_size=64, out_dtype=None, state_dtype=None, key_gate=None):
    """F(q, k, v, L, R, reverse) of DESIGN §2 in [B, T, H, D] layout, on Triton kernels.

    gl: left log decay, None or [B|1, T, H, K|1] (any strides: an expanded constant decay is read in place);
    gr: right log decay, None or [B, T, H, V] (or [.., 1], then moved to the left). Math in float32 (matmul
    operands in half precision where the inputs are). float64 inputs go to the PyTorch chunk path.
    Returns o [B, T, H, V] (out_dtype, default float32), the final state [B|N, H, K, V] float32 and the border
    states [B, H, n, K, V] (state_dtype, default float32; bfloat16 halves their traffic, as the output reads
    them back as matmul operands anyway; always float32 on the tf32 states path, utils.state_dot): going forward
    the state after each chunk, in reverse the state entering each chunk from its right end. key_gate: None or a
    log key gate [B, T, H]: k_t enters as exp(key_gate_t) k_t (not with float64 inputs)."""
    if gr is not None and gr.shape[-1] == 1:  # a scalar decay commutes: carry it on the left
        gl, gr = (gr if gl is None else gl + gr), None
    if torch.float64 in (q.dtype, k.dtype, v.dtype):
        from ..chunk_torch import chunk_recurrence
        return chunk_recurrence(q, k, v, gl, gr, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                                reverse=reverse, chunk_size=chunk_size, out_dtype=out_dtype, state_dtype=state_dtype)
    B, T, H, K = q.shape
    C = int(chunk_size)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    layout = make_layout(B, T, C, cu_seqlens, q.device)
    dot = dot_code(q, k, v)
    sdot = state_dot(dot)
    if sdot == DOT_TF32:  # the tf32 states path keeps its border states in float32
        state_dtype = torch.float32
    b = chunk_cumsum(gl, layout, reverse) if gl is not None else None
    c = chunk_cumsum(gr, layout, reverse) if gr is not None else None
    u = key_gate.contiguous() if key_gate is not None else None
    # precision part states_forward: the state kernel's matmuls in tf32, its border states still in the input dtype
    st_dot = part_dot("states_forward", dot, sdot)
    border, final, _ = chunk_states(k, v, b, c, h0, layout, reverse, st_dot, state_dtype or torch.float32, gate=u)
    o = chunk_output(q, k, v, b, c, border, h0, scale, layout, reverse, dot, out_dtype or torch.float32, gate=u,
                     state_dot=sdot)
    if reverse and (gl is not None or gr is not None):
        final = _final_decay(final, gl, gr, cu_seqlens)
    return o, final, border


# A constant decay's gradient is one sum over all B*T steps of q dq - k dk, terms that cancel; with half-precision
# matmul operands in the dQ and dK passes that sum loses ~1e-2 (seen on an H100 in bfloat16). autograd.py then
# runs those two passes on float32 copies (float32 matmuls, no tf32) when a constant decay needs its gradient.
chunk_recurrence_triton.constant_decay_grad_dtype = torch.float32

# The log-decay gradients of the backward (autograd.py) run as one kernel on the GPU.
chunk_recurrence_triton.log_decay_grad = log_decay_grad_triton

# The cumulative-sum kernel floors log decays as it reads them.
chunk_recurrence_triton.floors_log_decay = True


def _fused_backward(*args):
    from .backward import fused_backward  # imports this module
    return fused_backward(*args)


chunk_recurrence_triton.fused_backward = _fused_backward


def _fused_backward_right(*args):
    from .backward import fused_backward_right
    return fused_backward_right(*args)


chunk_recurrence_triton.fused_backward_right = _fused_backward_right


def _pick_chunk(ld, rd):
    """Default chunk size, measured on an H100 in bfloat16 at B=2 T=8192 H=16 K=V=128
    (benchmarks/results/core_vs_peers_h100_*.json): 128 is fastest and leaner without per-feature decays;
    with them the intra-chunk work grows with the chunk and 64 is fastest."""
    per_feature = (ld is not None and ld.dim() == 4) or rd is not None
    return 64 if per_feature else 128


chunk_recurrence_triton.pick_chunk = _pick_chunk
