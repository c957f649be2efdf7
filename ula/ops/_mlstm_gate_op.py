"""mLSTMexp's gate scan (ula/ops/_mlstm_gate_kernels.py) as a custom op pair (ula/core/custom_ops.py), taken while
torch.compile traces: otherwise a trace compiles the PyTorch form, whose float64 cummax backward Inductor fused into
a kernel that Triton 3.6 failed to compile (make_ttgir, on an H100 and an H200; the kernel:
benchmarks/results/session34_inductor_kernel_triton_failed.txt).

The kernels size their grids from shapes alone and read cu_seqlens on the device, so packed calls take the same
op, inside torch.compile's CUDA graphs (mode="reduce-overhead"). Session 34 had tagged it cudagraph_unsafe for packed
calls: with it inside the graphs, packed mLSTMexp went wrong from the first replay on. The cause was the core's
packed ops between the graphs (session 35, ula/core/custom_ops.py): they got the graphs' copy of cu_seqlens, whose
memory each call rewrote without a version bump, so ula.core.cu_cache returned the first call's layout.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..core.custom_ops import define_pair, fake_like, or_empty
from ._mlstm_gate_kernels import _backward, _forward


def _fwd(i: Tensor, f: Tensor, m0: Optional[Tensor], cu: Optional[Tensor],
         out_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _forward(i, f, m0, cu, out_dtype, True)  # ld', logw, m, m_T and the backward's per-step code


def _fwd_fake(i, f, m0, cu, out_dtype):
    B, T, H = i.shape
    N = B if cu is None else cu.shape[0] - 1
    f64 = torch.float64
    return (i.new_empty((B, T, H), dtype=out_dtype), i.new_empty((B, T, H), dtype=out_dtype),
            i.new_empty((B, T, H), dtype=f64), i.new_empty((N, H), dtype=f64),
            i.new_empty((B, T, H), dtype=torch.int32))


def _bwd(f: Tensor, code: Tensor, cu: Optional[Tensor], gldp: Optional[Tensor], glogw: Optional[Tensor],
         gm: Optional[Tensor], gmT: Optional[Tensor], m0: Optional[Tensor], i_dtype: torch.dtype) -> List[Tensor]:
    di, df, dm0 = _backward(f, code, cu, gldp, glogw, gm, gmT, None if m0 is None else (m0.dtype, m0.shape), i_dtype)
    return [di, df, or_empty(dm0, f)]


def _bwd_fake(f, code, cu, gldp, glogw, gm, gmT, m0, i_dtype):
    return [f.new_empty(f.shape, dtype=i_dtype), f.new_empty(f.shape),
            fake_like(m0, f)]


def _setup(ctx, inputs, output):
    i, f, m0, cu, out_dtype = inputs
    ctx.save_for_backward(f, output[4], cu, m0)
    ctx.i_dtype = i.dtype


def _grads(ctx, gldp, glogw, gm, gmT, _gcode, bwd):
    f, code, cu, m0 = ctx.saved_tensors
    di, df, dm0 = bwd(f, code, cu, gldp, glogw, gm, gmT, m0, ctx.i_dtype)
    return di, df, (dm0 if m0 is not None else None), None, None


gates_fwd, _ = define_pair("mlstm_exp_gates", _fwd, _fwd_fake, _bwd, _bwd_fake, _setup, _grads)
