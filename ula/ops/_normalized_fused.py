"""Normalized linear attention on the Triton kernels as one autograd Function: the core call with its column of
ones (ula/core/ones.py) and the epilogue (._normalized_epilogue), whose a part's gradient to v goes through the
core's dV pass.

As two Functions, the epilogue's backward wrote its share of dv, a Σ_{t>=n} dnum_t + ∂L/∂Z_T, and autograd added
it to the core's dv: a [B, T, H, V] write and a read-read-write add (0.062 ms of 1.58 at B2 T8192 H16 K=V=128 on an
H100, benchmarks/results/profile_normalized_h100_session16.txt). Here that share is a rank-one term of the dV
pass's scores (a against the constant key feature, paper 001's kernel a + b x) with the later chunks' part as its
state vector (._normalized_epilogue.dnum_borders), so dv is written once."""
import torch

from ..core import precision
from ..core.ones import _ones_backward, _ones_forward
from ..core.triton.chunk import make_layout
from . import _normalized_epilogue as epi


def _a_per_step(a, a_val, like):
    """a on every step, [B, T, H] float32 (the dV pass's rank-one feature): a [H] or the number a_val."""
    if a is None:
        return torch.full(like.shape, float(a_val), device=like.device, dtype=torch.float32)
    return a.view(1, 1, -1).expand(like.shape).contiguous()


class _NormalizedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, a, S0, n0, z0, c0, a_val, eps, cu_seqlens, C, prec, has_a):
        ctx.set_materialize_grads(False)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, S, n, zT, saved = _forward(q, k, v, a, S0, n0, z0, c0, a_val, eps, cu_seqlens, C, prec, has_a)
        ctx.save_for_backward(q, k, v, a, S0, n0, c0, *saved)
        ctx.cfg = (a_val, eps, cu_seqlens, C, prec, has_a, z0 is not None)
        return out, S, n, zT

    @staticmethod
    def backward(ctx, dout, dS, dn, dzT):
        q, k, v, a, S0, n0, c0, o, den, carry = ctx.saved_tensors
        dq, dk, dv, da, dS0, dn0, dz0, dc0 = _backward(q, k, v, a, S0, n0, c0, o, den, carry, dout, dS, dn, dzT,
                                                       *ctx.cfg)
        return dq, dk, dv, da, dS0, dn0, dz0, dc0, None, None, None, None, None, None


def _forward(q, k, v, a, S0, n0, z0, c0, a_val, eps, cu_seqlens, C, prec, has_a):
    """(out, S, n, Z_T, what the backward reads: (o, den, carry))."""
    o, den, S, n = _ones_forward(q, k, v, None, None, S0, n0, 1.0, cu_seqlens, C, prec)
    B, T = v.shape[:2]
    lay_e = make_layout(B, T, int(epi.CHUNK), cu_seqlens, v.device)
    out, carry, zT = epi.epilogue_forward(o, den, v, a, z0, c0, a_val, eps, lay_e, has_a)
    return out, S, n, zT, (o, den, carry)


def _backward(q, k, v, a, S0, n0, c0, o, den, carry, dout, dS, dn, dzT, a_val, eps, cu_seqlens, C, prec, has_a,
              has_z0):
    """(dq, dk, dv, da, dS0, dn0, dz0, dc0): the epilogue's backward (dnum, dden, da, dc0), the a part's dv borders
    per core chunk, then the core's backward with dv's rank-one term."""
    B, T = v.shape[:2]
    lay_e = make_layout(B, T, int(epi.CHUNK), cu_seqlens, v.device)
    dout = torch.zeros_like(v) if dout is None else dout.contiguous()
    do, dden, _, da, _, dc0 = epi.epilogue_backward(dout, dzT, o, den, v, a, c0, carry, lay_e, a_val, eps, has_a,
                                                    has_z0, dv_too=False)
    r1 = dz0 = None
    if has_a:
        lay_c = make_layout(B, T, C, cu_seqlens, v.device)
        borders, dz0 = epi.dnum_borders(dout, den, c0, a, a_val, eps, dzT, lay_c, has_a)
        r1 = (_a_per_step(a, a_val, den), borders)
    dq, dk, dv, _, dS0, _, dn0 = _ones_backward(q, k, v, None, None, S0, n0, do, dden, dS, dn, 1.0, cu_seqlens, C,
                                               False, prec, dv_rank_one=r1)
    return dq, dk, dv, da, dS0, (None if dn0 is None else dn0.to(n0.dtype)), (dz0 if has_z0 else None), dc0


def _dry(q, k, v, a, S0, n0, z0, c0, a_val, eps, cu_seqlens, C, prec, has_a, grad):
    """Forward and (with grad) backward of one call, for precompile.py's dry run (launches are compile requests)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, S, n, zT, saved = _forward(q, k, v, a, S0, n0, z0, c0, a_val, eps, cu_seqlens, C, prec, has_a)
    if grad:
        _backward(q, k, v, a, S0, n0, c0, *saved, torch.empty_like(out), None, None, None, a_val, eps, cu_seqlens, C,
                  prec, has_a, z0 is not None)


def normalized_fused(q, k, v, a, a_val, S0, n0, z0, c0, eps, cu_seqlens, C, has_a):
    """(out, S, n, Z_T) of normalized attention on the Triton kernels: q already times b (and L2-normalized), k;
    a [H] float32 or None (then the number a_val); initial state parts S0 [N, H, K, V], n0 [N, H, K], z0 [N, H, V],
    c0 [N, H] float32 or None; Z_T None unless has_a."""
    prec = precision.encode(precision.resolve(()))
    if q.is_cuda:  # a new configuration's kernels compiled in parallel before its first run
        from ..core.triton.precompile import compile_in_parallel, grad_wanted
        grad = grad_wanted(q, k, v, a, S0, n0, z0, c0)
        compile_in_parallel(("normalized", q, k, v, a, S0, n0, z0, c0, cu_seqlens, C, grad, prec, has_a), q,
                            lambda: _dry(q, k, v, a, S0, n0, z0, c0, a_val, eps, cu_seqlens, C, prec, has_a, grad))
    return _NormalizedFn.apply(q, k, v, a, S0, n0, z0, c0, a_val, eps, cu_seqlens, C, prec, has_a)
