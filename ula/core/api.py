"""The public entry point `linear_attention`: checks, backend choice, autograd."""
import torch
import torch.nn.functional as F

from .autograd import gated_keys
from .backends import chunk_fn, runs_triton
from . import precision as _precision
from . import time_split
from .checks import check_flag, check_linear_attention
from .op import run
from .reference import recurrence


def one_sequence_as_batch(q, cu_seqlens):
    """cu_seqlens of a single sequence ([0, T], as checked; B = 1) is the same call without it: None, so that it
    takes the non-varlen kernels and the splits along T that serve a long sequence at B = 1 (neither is taken with
    varlen). States [N = 1, ...] are [B = 1, ...] then."""
    if cu_seqlens is not None and cu_seqlens.numel() == 2 and q.shape[0] == 1:
        return None
    return cu_seqlens


def linear_attention(q, k, v, ld=None, rd=None, *, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, chunk_size=None, backend="auto", reverse=False, cp_group=None, key_gate=None,
                     precision=None):
    """Decayed linear attention, the recurrence of DESIGN §1:

        S_t = diag(exp ld_t) S_{t-1} diag(exp rd_t) + k_t v_tᵀ,    o_t = scale · S_tᵀ q_t

    q, k [B, T, H, K]; v [B, T, H, V]; ld None / [H] / [B, T, H] / [B, T, H, K] and rd None / [B, T, H, V]
    are log decays (float32, <= 0); initial_state [B, H, K, V] float32 ([N, H, K, V] with cu_seqlens, int
    [N + 1] offsets of N sequences packed along T with B == 1). scale defaults to K ** -0.5.
    reverse=True runs the recurrence from the end of each sequence to its start. chunk_size: a power of two
    from 16 to 1024, or None for the backend's choice (measured: see benchmarks/).
    Returns (o with the dtype of v, final state float32 (float64 for float64 inputs) or None). Differentiable in
    q, k, v, ld, rd and initial_state. backend: "auto" (Triton on CUDA, PyTorch elsewhere), "torch", "triton",
    "reference".
    cp_group: a torch.distributed ProcessGroup for context parallelism: each rank passes its contiguous slice
    of T, cu_seqlens stays global; see ula/core/context_parallel.py.
    key_gate: None or a log gate [B, T, H] (float32): k_t enters as exp(key_gate_t) k_t, e.g. mLSTM's input gate
    (log σ(ĩ)). Same as passing that k, but the Triton kernels apply it as they read k (no gated copy of k, and
    its gradient comes out of the backward's kernels); differentiable.
    The log decays' gradients are formed in closed form from the q, k and state gradients (paper 002, §4.1):
    their absolute error is a small fraction (float32: ~1e-5) of the terms they sum, so a decay gradient much
    smaller than those terms (per-step decays exp(ld) below ~1e-4) has a large relative error.
    precision: the matmul precision of the Triton kernels for half-precision inputs, "fast", "accurate" or parts
    (ula/core/precision.py); None takes the measured default (states_forward for a constant decay, else "fast").
    `ula.set_precision` overrides it for every call."""
    if cp_group is not None:  # checks there (cu_seqlens is global); the key gate goes to each rank's local pass
        from .context_parallel import cp_linear_attention
        return cp_linear_attention(q, k, v, ld, rd, cp_group=cp_group, scale=scale, initial_state=initial_state,
                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                   chunk_size=chunk_size, backend=backend, reverse=reverse, precision=precision,
                                   key_gate=key_gate)
    check_linear_attention(q, k, v, ld, rd, scale, initial_state, cu_seqlens, chunk_size, backend, key_gate)
    check_flag("linear_attention", "output_final_state", output_final_state)
    check_flag("linear_attention", "reverse", reverse)
    _precision.parse(precision, "linear_attention: precision")  # on every backend (the reference ignores it)
    cu_seqlens = one_sequence_as_batch(q, cu_seqlens)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if backend == "reference":
        if key_gate is not None:  # folded into k, kept wide: the reference computes in float64
            k = gated_keys(k, key_gate, keep_wide=True)
        o, S = recurrence(q, k, v, ld, rd, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, cu_seqlens=cu_seqlens, reverse=reverse)
        # the final state as the other backends return it: float32, float64 for float64 inputs
        sd = torch.float64 if q.dtype == torch.float64 else torch.float32
        return o.to(device=v.device, dtype=v.dtype), (None if S is None else S.to(q.device, sd))
    if chunk_size is None:
        pick = getattr(chunk_fn(backend, q.device), "pick_chunk", None)
        chunk_size = pick(ld, rd) if pick is not None else 64
    K, V = q.shape[-1], v.shape[-1]
    pk, pv = _pad_to_16(K), _pad_to_16(V)
    padded = (pk or pv) and runs_triton(backend, q.device)
    if padded:  # zero features: nothing changes but the rows' alignment (_pad_to_16)
        q, k = F.pad(q, (0, pk)), F.pad(k, (0, pk))
        v, rd = F.pad(v, (0, pv)), None if rd is None else F.pad(rd, (0, pv))
        ld = F.pad(ld, (0, pk)) if ld is not None and ld.dim() == 4 else ld
        initial_state = None if initial_state is None else F.pad(initial_state, (0, pv, 0, pk))
    # default, measured: a constant decay's output error drops below fla's at +6% time (RESULTS.md, session 13)
    prec = _precision.call_code(precision, ("states_forward",) if ld is not None and ld.dim() == 1 else (),
                                "linear_attention: precision")
    grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                           for x in (q, k, v, ld, rd, initial_state, key_gate))
    n_seg = time_split.segments(q, v, ld, rd, cu_seqlens, reverse, backend, chunk_size, grad)
    if n_seg > 1:  # a long sequence with few programs: split along T on this GPU (ula/core/time_split.py)
        o, S = time_split.split_run(q, k, v, ld, initial_state, scale, chunk_size, backend, key_gate, prec, n_seg,
                                    grad)
    else:
        o, S, _ = run(q, k, v, ld, rd, initial_state, cu_seqlens, scale, reverse, chunk_size, backend, key_gate,
                      prec)
    if not output_final_state:
        S = None
    if padded:
        o, S = o[..., :V].contiguous(), (None if S is None else S[..., :K, :V].contiguous())
    return o, S


def _pad_to_16(n):
    """Zero features that make a key or value width over 16 a multiple of 16 for the Triton kernels: with rows of
    another width the GPU compiler cannot prove their alignment, and the kernels spill (K = V = 100: 60 of 98
    configurations, up to 4.8 KB per thread on sm_90, tests/offline_compile.py; V = 129 ran 2.5-6.4x slower per
    kernel on an H100, benchmarks/RESULTS.md session 4). Widths up to 16 fill one tile anyway."""
    return 0 if n <= 16 or n % 16 == 0 else 16 - n % 16
