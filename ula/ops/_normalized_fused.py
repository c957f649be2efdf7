"""Normalized linear attention on the Triton kernels as one autograd Function: the a part and the division inside the
core's kernels with the column of ones (ula/core/ones.py).

    out_i = (a Z_i + b q_i S_i) / clamp_sign(a C_i + b q_i z_i)      Z = z0 + Σ v, C = c0 + count, z = Σ k

The constant a is one more feature of q against a constant 1 in k (paper 001's kernel a + b x): a rank-one term of
the scores (ula/core/triton/output.py, rank_one mode 1), whose state part is z0 + Σ v over the earlier chunks (summed
by the forward's state call, ula/core/ones.py's a_part) and whose share of the normalizer is a times the count. The
output kernel divides before it stores. Backward: dden = -Σ_v dnum out with dnum = dout / d (one kernel,
._normalized_epilogue.backward_from_output: it writes dden, 1 / d and the chunk sums of dnum), then the core's
backward with the column of ones on dout, each row weighted by 1 / d where the kernels read it (do_weight: no dnum
tensor written and read back), the dV pass carrying the a part as a rank-one term (mode 2) with the later chunks'
a Σ dnum as its state.

A float b is the core's scale (a enters as a / b). With it the L2 norm of q and k (Eq. 22) runs inside too: its
forward normalizes k in a pass before (._l2norm.unit_one, writing the rows and 1 / |k|) and q in the output kernel
as it reads it (chunk_output's qnorm: q's rows are not written; the kernel returns 1 / |q|); the backward reads q as
given, its rows weighted by 1 / |q| where q serves as keys or values, and the dQ and dK passes return the gradients
of the rows before the norm, (g - x (x·g)) / |x|, from the whole row they hold in one tile (the backward's two L2
kernels, 0.135 ms, gone for +0.059 ms in those passes at B2 T8192 H16 K=V=128 on an H100).

As an epilogue after the core (session 16, two Functions) this cost a forward kernel (0.080 ms at B2 T8192 H16
K=V=128 on an H100), the backward's dv of the a part and its add to the core's dv (0.062 ms) and two chunk-sum
passes (benchmarks/results/profile_normalized_h100_session16.txt)."""
import torch
from torch.autograd.function import once_differentiable

from ..core import precision
from ..core.ones import _ones_backward, _ones_forward
from ..core.chunk_layout import make_layout
from . import _normalized_epilogue as epi
from ._l2norm import unit_one


_L2_EPS = 1e-12  # F.normalize's


def _a_per_step(a, a_val, scale, shape, device):
    """a / scale on every step, [B, T, H] float32 (the rank-one feature of the output and dV passes, whose scores
    the core multiplies by scale = b): a [H] or the number a_val."""
    if a is None:
        return torch.full(shape, float(a_val) / scale, device=device, dtype=torch.float32)
    return (a / scale).view(1, 1, -1).expand(shape).contiguous()


class _NormalizedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, cu_seqlens, C, prec, has_a):
        ctx.set_materialize_grads(False)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, S, n, zT, saved = _forward(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, cu_seqlens, C, prec,
                                        has_a)
        ctx.save_for_backward(v, a, S0, n0, c0, *saved)
        ctx.cfg = (a_val, scale, eps, cu_seqlens, C, prec, has_a, z0 is not None)
        return out, S, n, zT

    @staticmethod
    @once_differentiable  # kernels' gradients carry no graph: a second derivative raises
    def backward(ctx, dout, dS, dn, dzT):
        v, a, S0, n0, c0, *saved = ctx.saved_tensors
        dq, dk, dv, da, dS0, dn0, dz0, dc0 = _backward(v, a, S0, n0, c0, *saved, dout, dS, dn, dzT, *ctx.cfg,
                                                       need_da=ctx.needs_input_grad[3])
        return dq, dk, dv, da, dS0, dn0, dz0, dc0, None, None, None, None, None, None, None, None


def _forward(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, cu_seqlens, C, prec, has_a):
    """(out, S, n, Z_T, what the backward reads: (q, k as the core took them (with l2 k normalized, q not), the
    norms' r or None, out, den, carry)). The core's scale is b, so a enters as a / b."""
    B, T, H = v.shape[:3]
    rk = None
    extra = dict(divide=eps)
    if l2:  # k normalized by a pass before, q by the output kernel as it reads it (r returned)
        k, rk = unit_one(k, _L2_EPS)
        extra["qnorm"] = _L2_EPS
    if has_a:
        e = _a_per_step(a, a_val, scale, (B, T, H), v.device)
        extra.update(count0=c0, a_part=(e, z0))  # the carry: z0 + Σ v before each chunk
    f = _ones_forward(q, k, v, None, None, S0, n0, scale, cu_seqlens, C, prec, **extra)
    return f["o"], f["S"], f["n"], f["zT"], (q, k, f["rq"], rk, f["o"], f["den"], f["carry"])


def _backward(v, a, S0, n0, c0, q, k, rq, rk, out, den, carry, dout, dS, dn, dzT, a_val, scale, eps, cu_seqlens, C,
              prec, has_a, has_z0, need_da=True):
    """(dq, dk, dv, da, dS0, dn0, dz0, dc0): the division's backward (1 / d, dden, da, dc0, and with the L2 norm q's
    weights) with the a part's dv borders per chunk, then the core's backward with dv's rank-one term."""
    B, T, H = v.shape[:3]
    layout = make_layout(B, T, C, cu_seqlens, v.device)
    dout = torch.zeros_like(v) if dout is None else dout.contiguous()
    need_da = need_da and a is not None and has_a
    q_norm = None if rk is None else (rq, scale, has_a)  # q entered before its norm (with l2)
    inv_d, dden, borders, da, dz0, dc0, qw = epi.backward_from_output(dout, dzT, out, den, v, a, c0, carry, layout,
                                                                      a_val, eps, need_da, q_norm)
    r1 = None
    if has_a:  # with q's weights their third is dv's rank-one e per step
        r1 = (_a_per_step(a, a_val, scale, (B, T, H), v.device) if qw is None else None, borders)
    dq, dk, dv, _, dS0, _, dn0 = _ones_backward(q, k, v, None, None, S0, n0, dout, dden, dS, dn, scale, cu_seqlens,
                                               C, False, prec, dv_rank_one=r1,
                                               project=None if rk is None else (rq, rk), do_weight=inv_d, q_raw=qw)
    return dq, dk, dv, da, dS0, (None if dn0 is None else dn0.to(n0.dtype)), (dz0 if has_z0 else None), dc0


def _dry(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, cu_seqlens, C, prec, has_a, grad):
    """Forward and (with grad) backward of one call, for precompile.py's dry run (launches are compile requests)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, S, n, zT, saved = _forward(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, cu_seqlens, C, prec, has_a)
    if grad:
        _backward(v, a, S0, n0, c0, *saved, torch.empty_like(out), None, None, None, a_val, scale, eps, cu_seqlens,
                  C, prec, has_a, z0 is not None)


def normalized_fused(q, k, v, a, a_val, scale, l2, S0, n0, z0, c0, eps, cu_seqlens, C, has_a):
    """(out, S, n, Z_T) of normalized attention on the Triton kernels: q times b unless b is `scale` (a float, not 0);
    q and k L2-normalized already, or by the Function where l2 (its backward then formed in the dQ and dK passes);
    a [H] float32 or None (then the number a_val); initial state parts S0 [N, H, K, V], n0 [N, H, K], z0 [N, H, V],
    c0 [N, H] float32 or None; Z_T None unless has_a."""
    prec = precision.encode(precision.resolve(()))
    if torch.compiler.is_compiling():  # the same kernels as a custom op, opaque to the trace
        from ._normalized_op import normalized_fwd, normalized_packed_fwd
        op = normalized_fwd if cu_seqlens is None else normalized_packed_fwd
        return op(q, k, v, a, S0, n0, z0, c0, a_val, float(scale), l2, eps, cu_seqlens, C, prec, has_a)[:4]
    if q.is_cuda:  # a new configuration's kernels compiled in parallel before its first run
        from ..core.triton.precompile import compile_in_parallel, grad_wanted
        grad = grad_wanted(q, k, v, a, S0, n0, z0, c0)
        compile_in_parallel(("normalized", q, k, v, a, S0, n0, z0, c0, cu_seqlens, C, grad, prec, has_a, l2), q,
                            lambda: _dry(q, k, v, a, S0, n0, z0, c0, a_val, scale, l2, eps, cu_seqlens, C, prec,
                                         has_a, grad))
    return _NormalizedFn.apply(q, k, v, a, S0, n0, z0, c0, a_val, float(scale), l2, eps, cu_seqlens, C, prec, has_a)
