"""ABC's cumulative softmax on its Triton kernels (ula/ops/_abc_softmax_kernels.py): an autograd Function for eager
calls, a custom op pair (ula/core/custom_ops.py) while torch.compile traces. The PyTorch form's float64
logcumsumexp took 2.3 ms of ABC's 7.6 ms eagerly (B2 T8192 H16 m = 64, H100), and compiled, Inductor's own float64
scans 13.7 ms. With an earlier form of the kernels (each block reading its sequence's earlier blocks) ABC's f+b
was 3.3 ms eagerly, and with the three-launch form (linear in T) 3.0 (benchmarks/RESULTS.md, GPU sessions 36 and
37). The kernels size their grids from shapes and read cu_seqlens on the device, so the op stays inside
torch.compile's CUDA graphs.

The backward reads φ, which the forward returns (float32), not w: its factors exp(z_j − z_{j+1}) are 1 − φ_{j+1}
(w only with z0, for dz0's factor at each sequence's first step). So the call keeps φ for the backward instead of w
and no other buffer, and no output of the op depends on a tile setting: a compiled graph holds its fake outputs'
shapes, and Inductor's FX graph cache keys a graph on the graph, not on what a fake function returns
(pytorch/pytorch#160472; session 37 saw an H100 serve one tree's graph, with a per-block buffer, to another)."""
from typing import List, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable
from torch import Tensor

from ..core.custom_ops import define_pair, fake_like, or_empty
from ._abc_softmax_kernels import backward, forward


class _CumulativeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, z0, cu):
        phi, zT = forward(w, z0, cu)
        ctx.save_for_backward(phi, None if z0 is None else w, z0, cu)
        ctx.w_dtype = w.dtype
        ctx.set_materialize_grads(False)
        return phi, zT

    @staticmethod
    @once_differentiable  # kernels' gradients carry no graph: a second derivative raises
    def backward(ctx, gphi, gzT):
        phi, w, z0, cu = ctx.saved_tensors
        dw, dz0 = backward(phi, w, z0, cu, gphi, gzT, ctx.w_dtype)
        return dw, dz0, None


def _fwd(w: Tensor, z0: Optional[Tensor], cu: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return forward(w, z0, cu)


def _fwd_fake(w, z0, cu):
    B, T, H, M = w.shape
    N = B if cu is None else cu.shape[0] - 1
    return w.new_empty((B, T, H, M), dtype=torch.float32), w.new_empty((N, H, M), dtype=torch.float32)


def _bwd(phi: Tensor, w: Optional[Tensor], z0: Optional[Tensor], cu: Optional[Tensor], gphi: Optional[Tensor],
         gzT: Optional[Tensor], w_dtype: torch.dtype) -> List[Tensor]:
    dw, dz0 = backward(phi, w, z0, cu, gphi, gzT, w_dtype)
    return [dw, or_empty(dz0, phi)]


def _bwd_fake(phi, w, z0, cu, gphi, gzT, w_dtype):
    return [phi.new_empty(phi.shape, dtype=w_dtype), fake_like(z0, phi)]


def _setup(ctx, inputs, output):
    w, z0, cu = inputs
    ctx.save_for_backward(output[0], None if z0 is None else w, z0, cu)
    ctx.w_dtype = w.dtype


def _grads(ctx, gphi, gzT, bwd):
    phi, w, z0, cu = ctx.saved_tensors
    dw, dz0 = bwd(phi, w, z0, cu, gphi, gzT, ctx.w_dtype)
    return dw, (dz0 if z0 is not None else None), None


_softmax_fwd, _ = define_pair("abc_softmax", _fwd, _fwd_fake, _bwd, _bwd_fake, _setup, _grads)


def _dry(w, z0, cu, grad):
    """Forward and (with grad) backward launches of one call, for precompile.py's dry run: dφ float32 as the second
    pass sends it; dz_T's kernels only with a final state, compiled by its first call if so."""
    phi, _ = forward(w, z0, cu)
    if grad:
        backward(phi, w, z0, cu, phi, None, w.dtype)


def cumulative_softmax(w, z0, cu_seqlens):
    """(φ [B, T, H, m] float32, z_T [N, H, m] float32) as gsa.py's `_cumulative_softmax`, on the kernels."""
    cu = None if cu_seqlens is None else cu_seqlens.to(w.device).contiguous()  # the kernels read it as an array
    if torch.compiler.is_compiling():
        return tuple(_softmax_fwd(w, z0, cu))
    if w.is_cuda:  # a new configuration's six kernels compiled in parallel before its first run
        from ..core.triton.precompile import compile_in_parallel, grad_wanted
        grad = grad_wanted(w, z0)
        compile_in_parallel(("abc_softmax", w, z0, cu, grad), w, lambda: _dry(w, z0, cu, grad))
    return _CumulativeSoftmax.apply(w, z0, cu)
