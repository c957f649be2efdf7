"""Row-wise L2 normalization of q and k on the Triton backend (normalized linear attention, Eq. 22): one autograd
Function, one kernel per tensor forward and backward, float32 inside, outputs in the inputs' dtype.

    y = x / max(|x|, eps)         (F.normalize(x, dim=-1) with its eps)
    dx = (dy - y (Σ dy·y)) / max(|x|, eps)     (the second term only where |x| >= eps, as F.normalize's)

F.normalize's forward and backward are ~8 PyTorch kernels per tensor, most of them broadcasting divisions that
read and write whole [B, T, H, K] tensors; here each tensor is read once forward (written once) and x, dy read
once backward (dx written)."""
import torch
import triton
import triton.language as tl

from ..core.triton.utils import alloc, block, cdiv, launch

_TILE = 4096  # elements of a [rows, D] tile


@triton.jit
def unit_rows(xt, eps):
    """(xt / max(|x|, eps) per row, |x|, max(|x|, eps)) of a float32 [rows, D] tile holding whole rows."""
    n = tl.sqrt(tl.sum(xt * xt, 1))
    d = tl.maximum(n, eps)
    return xt / d[:, None], n, d


@triton.jit
def signed_inverse(n, d, eps):
    """1 / max(|x|, eps), negative where the clamp acts (there the backward has no projection term)."""
    return tl.where(n >= eps, 1.0 / d, -1.0 / d)


@triton.jit
def _l2norm_kernel(x, dy, y, R, D, eps, BR: tl.constexpr, BD: tl.constexpr, BACKWARD: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mk = (rows < R)[:, None] & (cols < D)[None, :]
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    xt = tl.load(x + off, mask=mk, other=0.0).to(tl.float32)
    yt, n, d = unit_rows(xt, eps)
    if BACKWARD:  # (dy - y (Σ dy·y)) / d, the second term where the clamp passes
        g = tl.load(dy + off, mask=mk, other=0.0).to(tl.float32)
        s = tl.where(n >= eps, tl.sum(g * yt, 1), 0.0)
        yt = (g - yt * s[:, None]) / d[:, None]
    tl.store(y + off, yt.to(y.dtype.element_ty), mask=mk)


def _run(x, dy, eps):
    D = x.shape[-1]
    R = x.numel() // D
    BD = block(D, 1 << 30)
    BR = max(1, _TILE // BD)
    y = alloc(x.shape, x.device, x.dtype)
    launch(_l2norm_kernel, (cdiv(R, BR),), x, dy if dy is not None else x, y, R, D, eps, BR=BR, BD=BD,
           BACKWARD=dy is not None)
    return y


class _L2NormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, eps):
        ctx.set_materialize_grads(False)
        q, k = q.contiguous(), k.contiguous()
        ctx.save_for_backward(q, k)
        ctx.eps = eps
        return _run(q, None, eps), _run(k, None, eps)

    @staticmethod
    def backward(ctx, dq, dk):
        q, k = ctx.saved_tensors
        dq = None if dq is None else _run(q, dq.contiguous(), ctx.eps)
        dk = None if dk is None else _run(k, dk.contiguous(), ctx.eps)
        return dq, dk, None


def l2_normalize(q, k, eps=1e-12):
    """(F.normalize(q, dim=-1), F.normalize(k, dim=-1)) in q's and k's dtypes, on Triton kernels."""
    return _L2NormFn.apply(q, k, float(eps))
