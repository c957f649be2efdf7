"""Normalized attention's inputs before the core's forward, in one pass over q, k and v: the L2-normalized rows of q
and k (Eq. 22) with their 1 / |x| (the dQ and dK passes form the norm's backward from them), and the sums of v over
each chunk of the core's layout (the a part's state, z0 + Σ v over the earlier chunks, is their scan).

As three kernels (the L2 norm of q, that of k, the chunk sums of v) these took 0.045 + 0.045 + 0.039 ms at B2 T8192
H16 K=V=128 bf16 on an H100, the sums at 1.7 TB/s (benchmarks/results/pending18_h100_session18_part2_new.log);
here one launch, a program per (chunk, head, tensor), 0.120 ms."""
import triton
import triton.language as tl

from ..core.triton.utils import alloc, block, chunk_bounds, launch, tuned
from ._l2norm import signed_inverse, unit_rows

# (elements of a [rows, width] tile, warps), unless ULA_TUNE_PREPARE="elements,warps": the fastest on an H100 at B2
# T8192 H16 K=V=128 since the v sums' accumulator is summed once after the loop: 0.118 ms (8192,8 0.140; 4096,4 0.142;
# v sums alone 0.037 / 0.039 / 0.034, results/pending19_h100_session19_part7.log)
_TILE = (16384, 8)


@triton.jit
def _normalize_block(x, y, r, ri, m, kc, mk, K, eps):
    """y = x / max(|x|, eps) and r = signed_inverse for one block of whole rows (ri: their row indices)."""
    off = ri[:, None] * K + kc[None, :]
    mm = m[:, None] & mk[None, :]
    yt, n, d = unit_rows(tl.load(x + off, mask=mm, other=0.0).to(tl.float32), eps)
    tl.store(y + off, yt.to(y.dtype.element_ty), mask=mm)
    tl.store(r + ri, signed_inverse(n, d, eps), mask=m)


@triton.jit
def _prepare_kernel(q, k, v, qn, kn, rq, rk, sums, cu, chunk_seq, chunk_start, T, H, K, V, n, eps,
                    C: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, VARLEN: tl.constexpr,
                    L2: tl.constexpr, SUMS: tl.constexpr):
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    job = i_c // n  # one of q, k (with L2), v (with SUMS) per program
    i_c = i_c % n
    job_v = 2 if L2 else 0
    seq, cs, bos, ce = chunk_bounds(i_c, i_b, cu, chunk_seq, chunk_start, T, C, VARLEN)
    row0 = i_b.to(tl.int64) * T * H + i_h  # [B, T, H, D] contiguous: step t's row is row0 + t H
    kc = tl.arange(0, BK)
    mk = kc < K
    vc = tl.arange(0, BV)
    mv = vc < V
    acc = tl.zeros([BR, BV], dtype=tl.float32)  # summed over its rows once, after the loop
    for r in range(0, C, BR):
        rows = cs + r + tl.arange(0, BR)
        m = rows < ce
        ri = row0 + rows.to(tl.int64) * H
        if L2:
            if job == 0:
                _normalize_block(q, qn, rq, ri, m, kc, mk, K, eps)
            elif job == 1:
                _normalize_block(k, kn, rk, ri, m, kc, mk, K, eps)
        if SUMS and job == job_v:
            acc += tl.load(v + ri[:, None] * V + vc[None, :], mask=m[:, None] & mv[None, :], other=0.0).to(tl.float32)
    if SUMS and job == job_v:
        tl.store(sums + ((i_b * n + i_c).to(tl.int64) * H + i_h) * V + vc, tl.sum(acc, 0), mask=mv)


def prepare(q, k, v, layout, l2, sums, eps=1e-12):
    """(q, k, rq, rk, v_sums) for contiguous q, k [B, T, H, K], v [B, T, H, V]: with l2, q and k L2-normalized in
    their dtype and r = 1 / max(|x|, eps) per row, [B, T, H] float32, negative where the clamp acts (else q, k as
    given and None, None); with sums, Σ v over each chunk of `layout`, [B * chunks, H, V] float32 (else None)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK, BV = block(K, 1 << 30), block(V, 1 << 30)
    elements, warps = tuned("prepare", _TILE)
    BR = max(1, min(block(layout.C, 1 << 30, lo=1), elements // max(BK, BV)))
    qn = kn = rq = rk = s = None
    if l2:
        qn, kn = alloc(q.shape, q.device, q.dtype), alloc(k.shape, k.device, k.dtype)
        rq, rk = alloc((B, T, H), q.device), alloc((B, T, H), q.device)
    if sums:
        s = alloc((B * layout.n, H, V), v.device)
    stand_in = q  # a pointer the kernel does not touch
    jobs = 2 * l2 + sums
    launch(_prepare_kernel, (layout.n * jobs, H, B), q, k, v, qn if l2 else stand_in, kn if l2 else stand_in,
           rq if l2 else stand_in, rk if l2 else stand_in, s if sums else stand_in, layout.cu, layout.chunk_seq,
           layout.chunk_start, T, H, K, V, layout.n, float(eps), C=layout.C, BR=BR, BK=BK, BV=BV,
           VARLEN=layout.varlen, L2=l2, SUMS=sums, num_warps=warps)
    return (qn, kn, rq, rk, s) if l2 else (q, k, None, None, s)
