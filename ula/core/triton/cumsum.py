"""Kernel 1: chunk-local cumulative sum of a log decay (paper 000, Alg. 5, in log space).

Forward: b_t = sum of g over the chunk's steps up to t. Reverse: step t takes the decay of step t+1 (0 past the
end of its sequence) and the sum runs from t to the chunk's end. Chunks start at each sequence's first step.
Reads g through its strides (an expanded [1, T, H, 1] view of a constant decay costs no copy); writes a
contiguous float32 [Bg, T, H, D]. Log decays are floored at LOG_DECAY_FLOOR on the way in (autograd.py says
why), so callers pass them as they are."""
import triton
import triton.language as tl

from ..autograd import LOG_DECAY_FLOOR
from .utils import alloc, block, cdiv, launch


@triton.jit
def _cumsum_kernel(g, out, cu, chunk_seq, chunk_start, T, H, D, sg_b, sg_t, sg_h, sg_d,
                   C: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, REVERSE: tl.constexpr,
                   VARLEN: tl.constexpr, FLOOR: tl.constexpr):
    i_c, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # chunks on axis 0 (up to 2^31)
    i_b, i_h = i_bh // H, i_bh % H
    if VARLEN:
        seq = tl.load(chunk_seq + i_c)
        cs = tl.load(chunk_start + i_c)
        eos = tl.load(cu + seq + 1)
    else:
        cs = i_c * C
        eos = T
    ce = tl.minimum(cs + C, eos)
    cols = i_d * BD + tl.arange(0, BD)
    mcol = cols < D
    g_base = g + i_b.to(tl.int64) * sg_b + i_h * sg_h
    o_base = out + (i_b.to(tl.int64) * T * H + i_h) * D
    carry = tl.zeros([BD], dtype=tl.float32)
    for r in range(0, C, BR):
        if REVERSE:
            rows = cs + (C - BR - r) + tl.arange(0, BR)
            src = rows + 1
            msrc = (rows < ce) & (src < eos)
        else:
            rows = cs + r + tl.arange(0, BR)
            src = rows
            msrc = rows < ce
        x = tl.load(g_base + src.to(tl.int64)[:, None] * sg_t + cols[None, :] * sg_d,
                    mask=msrc[:, None] & mcol[None, :], other=0.0).to(tl.float32)
        x = tl.maximum(x, FLOOR)
        y = tl.cumsum(x, 0, reverse=REVERSE) + carry[None, :]
        carry += tl.sum(x, 0)
        tl.store(o_base + rows.to(tl.int64)[:, None] * (H * D) + cols[None, :], y,
                 mask=(rows < ce)[:, None] & mcol[None, :])


def chunk_cumsum(g, layout, reverse):
    """g [Bg, T, H, D] (any strides) -> chunk-local cumulative log decay, contiguous float32 [Bg, T, H, D].
    Log decays are floored at LOG_DECAY_FLOOR on the way in (ula/core/autograd.py says why): no floored copy."""
    Bg, T, H, D = g.shape
    out = alloc((Bg, T, H, D), g.device)
    C = layout.C
    BR = min(C, 64)
    BD = block(D, 32, lo=1)
    grid = (layout.n, cdiv(D, BD), Bg * H)
    launch(_cumsum_kernel, grid, g, out, layout.cu, layout.chunk_seq, layout.chunk_start, T, H, D, *g.stride(),
           C=C, BR=BR, BD=BD, REVERSE=reverse, VARLEN=layout.varlen,
           FLOOR=LOG_DECAY_FLOOR)
    return out
