"""mLSTMexp's epilogue (ula/ops/mlstm.py: `_exp_run`) on the Triton backend: one kernel forward, one backward.

The PyTorch code, with m̂ the detached max state and f = exp(m̂ − m) (value 1, `_one(-m)`), per row (b, t, h):

    h = o f / (max(|den f|, c) + eps),   c = min(exp(−m), float32 max)   (exp in m's dtype, then float32)

At f = 1, with D = max(|den|, c) + eps, h = o / D. Backward from dh, with g = Σ_v dh ⊙ o (float32):

    do   = dh / D
    dden = −g w sign(den) / D²
    dm   = −g (eps + (1 − w) c [clamped]) / D²

w = 1 where |den| > c, 1/2 on a tie (torch.maximum splits the gradient evenly), 0 where c wins; [clamped]:
exp(−m) above the float32 maximum (torch's clamp passes no gradient there). dm by the chain rule: f gives
−g / D directly, D (through den f, ∂(den f)/∂m = −den, and through c, ∂c/∂m = −c [unclamped]) gives
g (w |den| + (1 − w) c [unclamped]) / D²; as max(|den|, c) = w |den| + (1 − w) c, their sum is the form above,
where no O(1) terms cancel (with eps = 0 and no clamp dm is exactly 0: h does not depend on m). All float32 but
exp(−m), taken in m's own dtype (float64 from the gate kernel: m grows with T, its float32 rounding would move c
by |m| 2⁻²⁴ relative). Divisions, not reciprocals: 1/D is subnormal where c is clamped.

Layout: one program per (block of BT steps, head, batch row), the whole V of the head as one tile (its sum for
g in one pass); o, dh, den, m read through their strides (the generic core path gives slices), h, do, dden, dm
written contiguous in the dtypes of o, o, den, m."""
import torch
from torch.autograd.function import once_differentiable
import triton
import triton.language as tl

from ..core.triton.utils import alloc, block, cdiv, launch, tuned

_F32_MAX = tl.constexpr(torch.finfo(torch.float32).max)


@triton.jit
def _denominator(den, m, off_d, off_m, mr, eps, M64: tl.constexpr):
    """(den, |den|, c, whether exp(−m) passed the clamp, D) of a block of rows, float32."""
    dn = tl.load(den + off_d, mask=mr, other=1.0).to(tl.float32)
    if M64:
        e = tl.exp(-tl.load(m + off_m, mask=mr, other=0.0).to(tl.float64))
    else:
        e = tl.exp(-tl.load(m + off_m, mask=mr, other=0.0).to(tl.float32))
    c = tl.minimum(e, _F32_MAX).to(tl.float32)
    a = tl.abs(dn)
    return dn, a, c, e > _F32_MAX, tl.maximum(a, c, propagate_nan=tl.PropagateNan.ALL) + eps


@triton.jit
def _rows(T, H, i_t, i_h, i_b, sd_b, sd_t, sd_h, sm_b, sm_t, sm_h, BT: tl.constexpr, BV: tl.constexpr, V):
    """Steps of the block, their mask, the offsets of den and m, the rows of the contiguous outputs, the columns
    and the tile's mask."""
    rows = i_t * BT + tl.arange(0, BT)
    r64 = rows.to(tl.int64)
    b64 = i_b.to(tl.int64)
    cols = tl.arange(0, BV)
    mr = rows < T
    return (r64, mr, b64 * sd_b + r64 * sd_t + i_h * sd_h, b64 * sm_b + r64 * sm_t + i_h * sm_h,
            (b64 * T + r64) * H + i_h, cols, mr[:, None] & (cols < V)[None, :])


@triton.jit
def _tile(x, i_b, i_h, r64, cols, mk, s_b, s_t, s_h, s_v):
    """[BT, BV] of a [B, T, H, V] tensor read through its strides, float32."""
    off = i_b.to(tl.int64) * s_b + i_h * s_h + r64[:, None] * s_t + cols[None, :] * s_v
    return tl.load(x + off, mask=mk, other=0.0).to(tl.float32)


@triton.jit
def _mlstm_epilogue_fwd_kernel(o, den, m, h, T, H, V, eps, so_b, so_t, so_h, so_v, sd_b, sd_t, sd_h, sm_b, sm_t,
                               sm_h, BT: tl.constexpr, BV: tl.constexpr, M64: tl.constexpr):
    i_t, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r64, mr, off_d, off_m, out, cols, mk = _rows(T, H, i_t, i_h, i_b, sd_b, sd_t, sd_h, sm_b, sm_t, sm_h, BT, BV, V)
    _, _, _, _, D = _denominator(den, m, off_d, off_m, mr, eps, M64)
    x = _tile(o, i_b, i_h, r64, cols, mk, so_b, so_t, so_h, so_v)
    tl.store(h + out[:, None] * V + cols[None, :], (x / D[:, None]).to(h.dtype.element_ty), mask=mk)


@triton.jit
def _mlstm_epilogue_bwd_kernel(o, den, m, dh, do, dden, dm, T, H, V, eps, so_b, so_t, so_h, so_v, sd_b, sd_t, sd_h,
                               sm_b, sm_t, sm_h, sg_b, sg_t, sg_h, sg_v, BT: tl.constexpr, BV: tl.constexpr,
                               M64: tl.constexpr):
    i_t, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r64, mr, off_d, off_m, out, cols, mk = _rows(T, H, i_t, i_h, i_b, sd_b, sd_t, sd_h, sm_b, sm_t, sm_h, BT, BV, V)
    dn, a, c, clamped, D = _denominator(den, m, off_d, off_m, mr, eps, M64)
    x = _tile(o, i_b, i_h, r64, cols, mk, so_b, so_t, so_h, so_v)
    y = _tile(dh, i_b, i_h, r64, cols, mk, sg_b, sg_t, sg_h, sg_v)
    tl.store(do + out[:, None] * V + cols[None, :], (y / D[:, None]).to(do.dtype.element_ty), mask=mk)
    q = tl.sum(x * y, 1) / D  # g / D; g / D² as (g / D) / D: D² overflows float32 from D ~ 2e19
    w = tl.where(a > c, 1.0, tl.where(a == c, 0.5, 0.0))
    sg = tl.where(dn > 0, 1.0, tl.where(dn < 0, -1.0, 0.0))
    # the factors first (w sg exact), so a term that is 0 stays 0 where g / D² would overflow (D ~ exp(−80))
    tl.store(dden + out, (-(q * (w * sg)) / D).to(dden.dtype.element_ty), mask=mr)
    t = eps + tl.where(clamped, (1.0 - w) * c, 0.0)
    tl.store(dm + out, (-q * (t / D)).to(dm.dtype.element_ty), mask=mr)


def _tiles(T, V):
    """(BT steps, BV, warps): a [BT, BV] tile of about 4096 elements (untimed on a GPU: a memory-bound pass,
    ULA_TUNE_MLSTM_EPILOGUE="elements,warps" to sweep), BT no longer than T needs."""
    elems, warps = tuned("mlstm_epilogue", (4096, 4))
    BV = block(V, 1 << 30)
    return min(block(max(1, elems // BV), 1 << 30, lo=1), block(T, 1 << 30, lo=1)), BV, warps


class _EpilogueFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, den, m, eps):
        B, T, H, V = o.shape
        BT, BV, W = _tiles(T, V)
        h = alloc(o.shape, o.device, o.dtype)
        launch(_mlstm_epilogue_fwd_kernel, (cdiv(T, BT), H, B), o, den, m, h, T, H, V, eps, *o.stride(),
               *den.stride(), *m.stride(), BT=BT, BV=BV, M64=m.dtype == torch.float64, num_warps=W)
        ctx.save_for_backward(o, den, m)
        ctx.eps = eps
        return h

    @staticmethod
    @once_differentiable  # kernels' gradients carry no graph: a second derivative raises
    def backward(ctx, dh):
        o, den, m = ctx.saved_tensors
        B, T, H, V = o.shape
        BT, BV, W = _tiles(T, V)
        do = alloc(o.shape, o.device, o.dtype)
        dden = alloc(den.shape, o.device, den.dtype)
        dm = alloc(m.shape, o.device, m.dtype)
        launch(_mlstm_epilogue_bwd_kernel, (cdiv(T, BT), H, B), o, den, m, dh, do, dden, dm, T, H, V, ctx.eps,
               *o.stride(), *den.stride(), *m.stride(), *dh.stride(), BT=BT, BV=BV, M64=m.dtype == torch.float64,
               num_warps=W)
        need = ctx.needs_input_grad
        return do if need[0] else None, dden if need[1] else None, dm if need[2] else None, None


def mlstm_exp_epilogue(o, den, m, eps):
    """h = o exp(m̂ − m) / (max(|den exp(m̂ − m)|, min(exp(−m), float32 max)) + eps) in o's dtype, as
    `ula.ops.mlstm._exp_run`'s PyTorch code computes it (same value, the same gradients for o, den, m).
    o [B, T, H, V] (float32 or half precision), den [B, T, H], m [B, T, H] (float32 or float64), any strides."""
    return _EpilogueFn.apply(o, den, m, float(eps))
