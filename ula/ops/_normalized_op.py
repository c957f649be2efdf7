"""Normalized attention's Triton Function (._normalized_fused) as a custom op pair (ula/core/custom_ops.py), taken
while torch.compile traces: the trace then runs the same kernels as an eager call (the L2 norm, the a part and the
division inside the core's kernels), not the PyTorch L2 norm and epilogue (compiled: 1-2e-2 from eager in bf16, and
4.42 against 2.62 ms per forward+backward on an H100, benchmarks/RESULTS.md session 34). The Function's chunk carry
has one row per chunk; packed, that count comes from cu_seqlens' values, so the op returns it padded to a bound from
shapes alone: Σ cdiv(L_i, C) <= T // C + N (the kernels read only the rows of chunks that exist). Packed, the pair
is tagged cudagraph_unsafe, like the core's."""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..core.custom_ops import EMPTY, dense_and_packed, fake_like, or_empty
from ._normalized_fused import _backward, _forward

def _carry_rows(B, T, C, cu):
    """The carry's rows: B chunks per row of T steps, or packed the bound T // C + N."""
    return B * -(-T // C) if cu is None else T // C + cu.shape[0] - 1


def _fwd(q: Tensor, k: Tensor, v: Tensor, a: Optional[Tensor], S0: Optional[Tensor], n0: Optional[Tensor],
         z0: Optional[Tensor], c0: Optional[Tensor], a_val: float, scale: float, l2: bool, eps: float,
         cu: Optional[Tensor], C: int, prec: str,
         has_a: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, S, n, Z_T, then what the backward reads: k normalized (with l2), r of q and k (with l2), den, carry);
    absent ones empty (an output may not be an input: k as given is read from the inputs)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, S, n, zT, (_, k_used, rq, rk, _, den, carry) = _forward(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps,
                                                                 cu, C, prec, has_a)
    f = v.new_empty(EMPTY, dtype=torch.float32)
    if carry is not None and cu is not None:
        rows = _carry_rows(*v.shape[:2], C, cu)
        carry = torch.cat([carry, carry.new_zeros((rows - carry.shape[0],) + tuple(carry.shape[1:]))])
    return (out, S, n, or_empty(zT, f), k_used if l2 else k.new_empty(EMPTY), or_empty(rq, f), or_empty(rk, f), den,
            or_empty(carry, f))


def _fwd_fake(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, cu, C, prec, has_a):
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu is None else cu.shape[0] - 1
    f = lambda *shape: v.new_empty(shape, dtype=torch.float32)  # noqa: E731
    r = f(B, T, H) if l2 else f(0)
    return (v.new_empty((B, T, H, V)), f(N, H, K, V), f(N, H, K), f(N, H, V) if has_a else f(0),
            fake_like(k, k, l2), r, r.new_empty(r.shape), f(B, T, H),
            f(_carry_rows(B, T, C, cu), H, V) if has_a else f(0))


def _bwd(v: Tensor, a: Optional[Tensor], S0: Optional[Tensor], n0: Optional[Tensor], c0: Optional[Tensor], q: Tensor,
         k: Tensor, rq: Optional[Tensor], rk: Optional[Tensor], out: Tensor, den: Tensor, carry: Optional[Tensor],
         dout: Optional[Tensor], dS: Optional[Tensor], dn: Optional[Tensor], dzT: Optional[Tensor], a_val: float,
         scale: float, eps: float, cu: Optional[Tensor], C: int, prec: str, has_a: bool, has_z0: bool,
         need_da: bool) -> List[Tensor]:
    g = _backward(v, a, S0, n0, c0, q, k, rq, rk, out, den, carry, dout, dS, dn, dzT, a_val, scale, eps, cu, C,
                  prec, has_a, has_z0, need_da)
    return [or_empty(x, v) for x in g]


def _bwd_fake(v, a, S0, n0, c0, q, k, rq, rk, out, den, carry, dout, dS, dn, dzT, a_val, scale, eps, cu, C, prec,
              has_a, has_z0, need_da):
    N = v.shape[0] if cu is None else cu.shape[0] - 1
    z0_like = v.new_empty((N,) + tuple(v.shape[2:]), dtype=torch.float32) if has_z0 else None
    return [fake_like(q, v), fake_like(k, v), fake_like(v, v), fake_like(a, v, need_da and has_a), fake_like(S0, v),
            fake_like(n0, v), fake_like(z0_like, v), fake_like(c0, v)]


def _setup(ctx, inputs, output):
    q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, cu, C, prec, has_a = inputs
    out, _, _, _, k_used, rq, rk, den, carry = output
    opt = lambda x: x if x.numel() else None  # noqa: E731
    ctx.save_for_backward(v, a, S0, n0, c0, q, k_used if l2 else k, opt(rq), opt(rk), out, den, opt(carry), cu)
    ctx.cfg = (a_val, scale, eps, C, prec, has_a, z0 is not None)


def _grads(ctx, dout, dS, dn, dzT, *_unused_and_bwd):
    bwd = _unused_and_bwd[-1]
    v, a, S0, n0, c0, q, k, rq, rk, out, den, carry, cu = ctx.saved_tensors
    a_val, scale, eps, C, prec, has_a, has_z0 = ctx.cfg
    need_da = ctx.needs_input_grad[3]
    dq, dk, dv, da, dS0, dn0, dz0, dc0 = bwd(v, a, S0, n0, c0, q, k, rq, rk, out, den, carry, dout, dS, dn,
                                             dzT if dzT is not None and dzT.numel() else None, a_val, scale, eps, cu,
                                             C, prec, has_a, has_z0, need_da)
    opt = lambda x, x_in: x if x_in is not None and x.numel() else None  # noqa: E731
    return (dq, dk, dv, opt(da, a), opt(dS0, S0), opt(dn0, n0), dz0 if has_z0 else None, opt(dc0, c0), None, None,
            None, None, None, None, None, None)


(normalized_fwd, _), (normalized_packed_fwd, _) = dense_and_packed("normalized", _fwd, _fwd_fake, _bwd, _bwd_fake,
                                                                   _setup, _grads)
