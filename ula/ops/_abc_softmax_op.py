"""ABC's cumulative softmax on its Triton kernels (ula/ops/_abc_softmax_kernels.py): an autograd Function for eager
calls, a custom op pair (ula/core/custom_ops.py) while torch.compile traces. The PyTorch form's float64
logcumsumexp took 2.3 ms of ABC's 7.6 ms eagerly (B2 T8192 H16 m = 64, H100), and compiled, Inductor's own float64
scans 13.7 ms. With an earlier form of the kernels (each block reading its sequence's earlier blocks) ABC's f+b
was 3.3 ms eagerly, and today's three-launch form (linear in T) takes 3.0 (benchmarks/RESULTS.md, GPU sessions 36
and 37). The kernels size their grids from shapes and read cu_seqlens on the device, so the op stays inside
torch.compile's CUDA graphs.

The op takes its tiles as an argument: its fake function sizes a buffer by the block length, and a compiled graph
holds the values it was traced with. Read inside, ULA_TUNE_ABC_SOFTMAX or set_tuning would leave Inductor's FX graph
cache (keyed on the graph, not on what a fake function returns: pytorch/pytorch#160472) serving a graph whose
buffer has the old block count: a size assertion in the compiled call (seen on an H100 in session 37, between two
trees whose block lengths differ; tests/test_compile.py shows it for two tunings)."""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..core.custom_ops import define_pair, fake_like, or_empty
from ._abc_softmax_kernels import backward, block_rows, forward, tiles


class _CumulativeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, z0, cu, grad, tiles):
        phi, zT, carry = forward(w, z0, cu, grad, tiles)
        ctx.save_for_backward(w, z0, cu, carry)
        ctx.tiles = tiles
        ctx.set_materialize_grads(False)
        return phi, zT

    @staticmethod
    def backward(ctx, gphi, gzT):
        w, z0, cu, carry = ctx.saved_tensors
        dw, dz0 = backward(w, z0, cu, carry, gphi, gzT, ctx.tiles)
        return dw, dz0, None, None, None


def _fwd(w: Tensor, z0: Optional[Tensor], cu: Optional[Tensor], tiles: List[int]) -> Tuple[Tensor, Tensor, Tensor]:
    return forward(w, z0, cu, True, tiles)


def _fwd_fake(w, z0, cu, tiles):
    B, T, H, M = w.shape
    N = B if cu is None else cu.shape[0] - 1
    f32 = torch.float32
    return (w.new_empty((B, T, H, M), dtype=f32), w.new_empty((N, H, M), dtype=f32),
            w.new_empty((block_rows(B, T, N, cu is not None, tiles[0]), 2, H, M), dtype=f32))


def _bwd(w: Tensor, z0: Optional[Tensor], cu: Optional[Tensor], carry: Tensor, gphi: Optional[Tensor],
         gzT: Optional[Tensor], tiles: List[int]) -> List[Tensor]:
    dw, dz0 = backward(w, z0, cu, carry, gphi, gzT, tiles)
    return [dw, or_empty(dz0, w)]


def _bwd_fake(w, z0, cu, carry, gphi, gzT, tiles):
    return [w.new_empty(w.shape), fake_like(z0, w)]


def _setup(ctx, inputs, output):
    w, z0, cu, ctx.tiles = inputs
    ctx.save_for_backward(w, z0, cu, output[2])


def _grads(ctx, gphi, gzT, _gcarry, bwd):
    w, z0, cu, carry = ctx.saved_tensors
    dw, dz0 = bwd(w, z0, cu, carry, gphi, gzT, ctx.tiles)
    return dw, (dz0 if z0 is not None else None), None, None


_softmax_fwd, _ = define_pair("abc_softmax", _fwd, _fwd_fake, _bwd, _bwd_fake, _setup, _grads)


def _dry(w, z0, cu, grad, t):
    """Forward and (with grad) backward launches of one call, for precompile.py's dry run: dφ float32 as the second
    pass sends it; dz_T's kernels only with a final state, compiled by its first call if so."""
    phi, _, carry = forward(w, z0, cu, grad, t)
    if grad:
        backward(w, z0, cu, carry, phi, None, t)


def cumulative_softmax(w, z0, cu_seqlens):
    """(φ [B, T, H, m] float32, z_T [N, H, m] float32) as gsa.py's `_cumulative_softmax`, on the kernels."""
    cu = None if cu_seqlens is None else cu_seqlens.to(w.device)
    t = tiles()
    if torch.compiler.is_compiling():
        return tuple(_softmax_fwd(w, z0, cu, t)[:2])
    if w.is_cuda:  # a new configuration's six kernels compiled in parallel before its first run
        from ..core.triton.precompile import compile_in_parallel, grad_wanted
        grad = grad_wanted(w, z0)
        compile_in_parallel(("abc_softmax", w, z0, cu, grad, tuple(t)), w, lambda: _dry(w, z0, cu, grad, t))
    return _CumulativeSoftmax.apply(w, z0, cu, torch.is_grad_enabled(), t)  # (grad mode is off inside forward)
