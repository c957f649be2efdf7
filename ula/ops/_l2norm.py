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
def _l2norm_kernel(x, dy, y, r, R, D, eps, BR: tl.constexpr, BD: tl.constexpr, BACKWARD: tl.constexpr,
                   STORE_R: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mk = (rows < R)[:, None] & (cols < D)[None, :]
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    xt = tl.load(x + off, mask=mk, other=0.0).to(tl.float32)
    n = tl.sqrt(tl.sum(xt * xt, 1))
    d = tl.maximum(n, eps)
    yt = xt / d[:, None]
    if BACKWARD:  # (dy - y (Σ dy·y)) / d, the second term where the clamp passes
        g = tl.load(dy + off, mask=mk, other=0.0).to(tl.float32)
        s = tl.where(n >= eps, tl.sum(g * yt, 1), 0.0)
        yt = (g - yt * s[:, None]) / d[:, None]
    tl.store(y + off, yt.to(y.dtype.element_ty), mask=mk)
    if STORE_R:  # 1 / max(|x|, eps), negative where the clamp acts (there the backward has no projection term)
        tl.store(r + rows, tl.where(n >= eps, 1.0 / d, -1.0 / d), mask=rows < R)


def _run(x, dy, eps, with_r=False):
    D = x.shape[-1]
    R = x.numel() // D
    BD = block(D, 1 << 30)
    BR = max(1, _TILE // BD)
    y = alloc(x.shape, x.device, x.dtype)
    r = alloc(x.shape[:-1], x.device) if with_r else None
    launch(_l2norm_kernel, (cdiv(R, BR),), x, dy if dy is not None else x, y, r if with_r else y, R, D, eps, BR=BR,
           BD=BD, BACKWARD=dy is not None, STORE_R=with_r)
    return (y, r) if with_r else y


def normalize_rows(x, eps=1e-12):
    """(x / max(|x|, eps) in x's dtype, r [...] float32): r = 1 / max(|x|, eps), negative where the clamp acts. For a
    consumer that forms the backward itself, dx = (dy - y (Σ dy·y)) |r| with the second term where r > 0 (the core's
    dQ and dK passes, ula/ops/_normalized_fused.py); no autograd."""
    return _run(x.contiguous(), None, float(eps), with_r=True)


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
