"""Normalized attention's Triton Function (._normalized_fused) as a custom op pair (ula/core/custom_ops.py), taken
while torch.compile traces a call without cu_seqlens: the trace then runs the same kernels as an eager call (the L2
norm, the a part and the division inside the core's kernels), not the PyTorch epilogue. Packed calls keep the
PyTorch path there: the Function's chunk carry has one row per chunk, a count the fake function cannot know without
cu_seqlens' values."""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..core.custom_ops import define_pair
from ._normalized_fused import _backward, _forward

_EMPTY = (0,)


def _or_empty(x, like):
    return like.new_empty(_EMPTY) if x is None else x


def _fwd(q: Tensor, k: Tensor, v: Tensor, a: Optional[Tensor], S0: Optional[Tensor], n0: Optional[Tensor],
         z0: Optional[Tensor], c0: Optional[Tensor], a_val: float, scale: float, l2: bool, eps: float, C: int,
         prec: str, has_a: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, S, n, Z_T, then what the backward reads: k normalized (with l2), r of q and k (with l2), den, carry);
    absent ones empty (an output may not be an input: k as given is read from the inputs)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, S, n, zT, (_, k_used, rq, rk, _, den, carry) = _forward(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps,
                                                                 None, C, prec, has_a)
    f = v.new_empty(_EMPTY, dtype=torch.float32)
    return (out, S, n, _or_empty(zT, f), k_used if l2 else k.new_empty(_EMPTY), _or_empty(rq, f), _or_empty(rk, f),
            den, _or_empty(carry, f))


def _fwd_fake(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, C, prec, has_a):
    B, T, H, K = q.shape
    V = v.shape[-1]
    f = lambda *shape: v.new_empty(shape, dtype=torch.float32)  # noqa: E731
    r = f(B, T, H) if l2 else f(0)
    return (v.new_empty((B, T, H, V)), f(B, H, K, V), f(B, H, K), f(B, H, V) if has_a else f(0),
            k.new_empty(k.shape) if l2 else k.new_empty(_EMPTY), r, r.new_empty(r.shape), f(B, T, H),
            f(B * -(-T // C), H, V) if has_a else f(0))


def _bwd(v: Tensor, a: Optional[Tensor], S0: Optional[Tensor], n0: Optional[Tensor], c0: Optional[Tensor], q: Tensor,
         k: Tensor, rq: Optional[Tensor], rk: Optional[Tensor], out: Tensor, den: Tensor, carry: Optional[Tensor],
         dout: Optional[Tensor], dS: Optional[Tensor], dn: Optional[Tensor], dzT: Optional[Tensor], a_val: float,
         scale: float, eps: float, C: int, prec: str, has_a: bool, has_z0: bool, need_da: bool) -> List[Tensor]:
    g = _backward(v, a, S0, n0, c0, q, k, rq, rk, out, den, carry, dout, dS, dn, dzT, a_val, scale, eps, None, C,
                  prec, has_a, has_z0, need_da)
    return [_or_empty(x, v) for x in g]


def _bwd_fake(v, a, S0, n0, c0, q, k, rq, rk, out, den, carry, dout, dS, dn, dzT, a_val, scale, eps, C, prec, has_a,
              has_z0, need_da):
    like = lambda x, need=True: x.new_empty(x.shape) if (x is not None and need) else v.new_empty(_EMPTY)  # noqa: E731
    z0_like = v.new_empty((v.shape[0],) + tuple(v.shape[2:]), dtype=torch.float32) if has_z0 else None
    c0_like = None if c0 is None else c0
    return [like(q), like(k), like(v), like(a, need_da and a is not None and has_a), like(S0), like(n0), like(z0_like),
            like(c0_like)]


def _setup(ctx, inputs, output):
    q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, C, prec, has_a = inputs
    out, _, _, _, k_used, rq, rk, den, carry = output
    opt = lambda x: x if x.numel() else None  # noqa: E731
    ctx.save_for_backward(v, a, S0, n0, c0, q, k_used if l2 else k, opt(rq), opt(rk), out, den, opt(carry))
    ctx.cfg = (a_val, scale, eps, C, prec, has_a, z0 is not None)


def _grads(ctx, dout, dS, dn, dzT, *_unused_and_bwd):
    bwd = _unused_and_bwd[-1]
    v, a, S0, n0, c0, q, k, rq, rk, out, den, carry = ctx.saved_tensors
    a_val, scale, eps, C, prec, has_a, has_z0 = ctx.cfg
    need_da = ctx.needs_input_grad[3]
    dq, dk, dv, da, dS0, dn0, dz0, dc0 = bwd(v, a, S0, n0, c0, q, k, rq, rk, out, den, carry, dout, dS, dn,
                                             dzT if dzT is not None and dzT.numel() else None, a_val, scale, eps, C,
                                             prec, has_a, has_z0, need_da)
    opt = lambda x, x_in: x if x_in is not None and x.numel() else None  # noqa: E731
    return (dq, dk, dv, opt(da, a), opt(dS0, S0), opt(dn0, n0), dz0 if has_z0 else None, opt(dc0, c0), None, None,
            None, None, None, None, None)


normalized_fwd, _ = define_pair("normalized", _fwd, _fwd_fake, _bwd, _bwd_fake, _setup, _grads)
