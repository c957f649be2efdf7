"""Row-wise L2 normalization of q and k on the Triton backend (normalized linear attention, Eq. 22): one autograd
Function, one kernel per tensor forward and backward, float32 inside, outputs in the inputs' dtype.

    y = x / max(|x|, eps)         (F.normalize(x, dim=-1) with its eps)
    dx = (dy - y (Σ dy·y)) / max(|x|, eps)     (the second term only where |x| >= eps, as F.normalize's)

F.normalize's forward and backward are ~8 PyTorch kernels per tensor, most of them broadcasting divisions that
read and write whole [B, T, H, K] tensors; here each tensor is read once forward (written once) and x, dy read
once backward (dx written), and q and k share one launch forward."""
import torch
from torch.autograd.function import once_differentiable
import triton
import triton.language as tl

from ..core.triton.utils import alloc, block, cdiv, launch, signed_inverse, tuned, unit_rows

# (elements of a [rows, D] tile, warps), unless ULA_TUNE_L2NORM="elements,warps"
_TILE = (16384, 8)


@triton.jit
def _unit_block(x, y, r, R, D, eps, BR: tl.constexpr, BD: tl.constexpr, INVERSE: tl.constexpr):
    """y = x / max(|x|, eps) on program 0's block of rows, r = signed_inverse with INVERSE (unit_one)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mr = rows < R
    mk = mr[:, None] & (cols < D)[None, :]
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    yt, n, d = unit_rows(tl.load(x + off, mask=mk, other=0.0).to(tl.float32), eps)
    tl.store(y + off, yt.to(y.dtype.element_ty), mask=mk)
    if INVERSE:
        tl.store(r + rows, signed_inverse(n, d, eps), mask=mr)


@triton.jit
def _l2norm_pair_kernel(q, k, qn, kn, rq, rk, R, D, eps, BR: tl.constexpr, BD: tl.constexpr, INVERSE: tl.constexpr):
    """q's rows on grid axis 1's program 0, k's on program 1 (q and k of one shape: one launch)."""
    if tl.program_id(1) == 0:
        _unit_block(q, qn, rq, R, D, eps, BR, BD, INVERSE)
    else:
        _unit_block(k, kn, rk, R, D, eps, BR, BD, INVERSE)


@triton.jit
def _l2norm_backward_kernel(x, dy, dx, R, D, eps, BR: tl.constexpr, BD: tl.constexpr):
    """dx = (dy - y (Σ dy·y)) / d, the second term where the clamp passes."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mk = (rows < R)[:, None] & (cols < D)[None, :]
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    yt, n, d = unit_rows(tl.load(x + off, mask=mk, other=0.0).to(tl.float32), eps)
    g = tl.load(dy + off, mask=mk, other=0.0).to(tl.float32)
    s = tl.where(n >= eps, tl.sum(g * yt, 1), 0.0)
    tl.store(dx + off, ((g - yt * s[:, None]) / d[:, None]).to(dx.dtype.element_ty), mask=mk)


def _rows_tile(D):
    elements, warps = tuned("l2norm", _TILE)
    BD = block(D, 1 << 30)
    return BD, max(1, elements // BD), warps


def unit_pair(q, k, eps=1e-12):
    """(q / max(|q|, eps), k / max(|k|, eps) per row, in their dtypes) for contiguous q and k of one shape [..., D]."""
    assert q.shape == k.shape and q.is_contiguous() and k.is_contiguous()
    D = q.shape[-1]
    R = q.numel() // D
    BD, BR, warps = _rows_tile(D)
    qn, kn = alloc(q.shape, q.device, q.dtype), alloc(k.shape, k.device, k.dtype)
    launch(_l2norm_pair_kernel, (cdiv(R, BR), 2), q, k, qn, kn, qn, kn, R, D, eps, BR=BR, BD=BD, INVERSE=False,
           num_warps=warps)
    return qn, kn


def unit_one(x, eps=1e-12):
    """(x / max(|x|, eps) per row in x's dtype, r = 1 / max(|x|, eps) float32, negative where the clamp acts) for one
    contiguous tensor: normalized attention's k, whose q is normalized inside the forward's output kernel (the dQ and
    dK passes form the norm's backward from r, ula/ops/_normalized_fused.py)."""
    D = x.shape[-1]
    R = x.numel() // D
    BD, BR, warps = _rows_tile(D)
    y, r = alloc(x.shape, x.device, x.dtype), alloc(x.shape[:-1], x.device)
    launch(_l2norm_pair_kernel, (cdiv(R, BR), 1), x, x, y, y, r, r, R, D, eps, BR=BR, BD=BD, INVERSE=True,
           num_warps=warps)
    return y, r


def _backward(x, dy, eps):
    D = x.shape[-1]
    R = x.numel() // D
    BD, BR, warps = _rows_tile(D)
    dx = alloc(x.shape, x.device, x.dtype)
    launch(_l2norm_backward_kernel, (cdiv(R, BR),), x, dy, dx, R, D, eps, BR=BR, BD=BD, num_warps=warps)
    return dx


class _L2NormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, eps):
        ctx.set_materialize_grads(False)
        q, k = q.contiguous(), k.contiguous()
        ctx.save_for_backward(q, k)
        ctx.eps = eps
        return unit_pair(q, k, eps)

    @staticmethod
    @once_differentiable  # kernels' gradients carry no graph: a second derivative raises
    def backward(ctx, dq, dk):
        q, k = ctx.saved_tensors
        dq = None if dq is None else _backward(q, dq.contiguous(), ctx.eps)
        dk = None if dk is None else _backward(k, dk.contiguous(), ctx.eps)
        return dq, dk, None


def l2_normalize(q, k, eps=1e-12):
    """(F.normalize(q, dim=-1), F.normalize(k, dim=-1)) in q's and k's dtypes, on Triton kernels."""
    return _L2NormFn.apply(q, k, float(eps))
