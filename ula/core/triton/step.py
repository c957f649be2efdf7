"""One step of the core recurrence in one kernel (decoding, no gradient):

    S' = diag(exp ld) S diag(exp rd) + k vᵀ,      o = scale · S'ᵀ q

In PyTorch this is five or six kernels per layer and token (decay, outer product, add, product, sum), each
reading or writing the whole state; here each program owns a K x BV slab of the state: it reads it once, writes
it once, and its part of o."""
import triton
import triton.language as tl

from .utils import alloc, block, cdiv, launch


@triton.jit
def _step_kernel(q, k, v, ld, rd, s_in, s_out, o, H, K, V, scale,
                 LD: tl.constexpr, HAS_RD: tl.constexpr, HAS_S: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_h = i_bh % H
    kc = tl.arange(0, BK)
    vc = i_v * BV + tl.arange(0, BV)
    mk, mv = kc < K, vc < V
    m = mk[:, None] & mv[None, :]
    s_off = i_bh.to(tl.int64) * K * V + kc[:, None] * V + vc[None, :]
    if HAS_S:
        S = tl.load(s_in + s_off, mask=m, other=0.0).to(tl.float32)
        if LD == 1:  # one log decay per head [H]
            S = S * tl.exp(tl.load(ld + i_h).to(tl.float32))
        elif LD == 2:  # per sequence and head [B, H]
            S = S * tl.exp(tl.load(ld + i_bh).to(tl.float32))
        elif LD == 3:  # per feature [B, H, K]
            S = S * tl.exp(tl.load(ld + i_bh.to(tl.int64) * K + kc, mask=mk, other=0.0).to(tl.float32))[:, None]
        if HAS_RD:  # [B, H, V]
            S = S * tl.exp(tl.load(rd + i_bh.to(tl.int64) * V + vc, mask=mv, other=0.0).to(tl.float32))[None, :]
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    kt = tl.load(k + i_bh.to(tl.int64) * K + kc, mask=mk, other=0.0).to(tl.float32)
    vt = tl.load(v + i_bh.to(tl.int64) * V + vc, mask=mv, other=0.0).to(tl.float32)
    S += kt[:, None] * vt[None, :]
    tl.store(s_out + s_off, S, mask=m)
    qt = tl.load(q + i_bh.to(tl.int64) * K + kc, mask=mk, other=0.0).to(tl.float32)
    out = tl.sum(qt[:, None] * S, 0) * scale
    tl.store(o + i_bh.to(tl.int64) * V + vc, out.to(o.dtype.element_ty), mask=mv)


def recurrent_step_triton(q, k, v, ld, rd, state, scale, out=None):
    """q, k [B, H, K]; v [B, H, V]; ld None / [H] / [B, H] / [B, H, K]; rd None / [B, H, V]; state [B, H, K, V]
    float32 or None (zeros); scale a number. Returns (o [B, H, V] in v's dtype, new state float32). out: a
    contiguous float32 [B, H, K, V] for the new state, which may be `state` itself (each program reads its slab
    before it writes it). Shapes are the caller's to check (ula.ops._common._step); no gradient is recorded."""
    B, H, K = q.shape
    V = v.shape[-1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    S = alloc((B, H, K, V), q.device) if out is None else out
    o = alloc((B, H, V), q.device, v.dtype)
    mode = 0 if ld is None else ld.dim()  # 1: [H], 2: [B, H], 3: [B, H, K]
    has_rd, has_s = rd is not None, state is not None
    ld = ld.contiguous() if ld is not None else S  # unused pointers: any tensor
    rd = rd.contiguous() if has_rd else S
    s_in = state.contiguous() if has_s else S
    BK = block(K, 1 << 20)  # the whole key dimension in one program: o sums over it
    BV = block(V, max(16, 4096 // BK))  # a slab of at most 4096 float32 values in registers
    launch(_step_kernel, (cdiv(V, BV), B * H), q, k, v, ld, rd, s_in, S, o, H, K, V, float(scale),
           LD=mode, HAS_RD=has_rd, HAS_S=has_s, BK=BK, BV=BV, num_warps=4)
    return o, S


__all__ = ["recurrent_step_triton"]
