"""What a pass over whole rows reaches on this GPU: torch's copy and scale of one [B, T, H, D] bfloat16 tensor
against the L2 norm of q and k in one launch (ula/ops/_l2norm.py unit_pair), median of CUDA-event timings, as TB/s of
bytes read + written. Calibrates the row kernels of normalized attention (benchmarks/RESULTS.md, session 20).

    python3 benchmarks/gpu_rowpass_bandwidth.py [--shape 2,8192,16,128] [--reps 200]"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


_COPY = []


def _flat_copy(x, block=4096, warps=4):
    """A flat Triton copy (no rows): what the compiler's plainest pass reaches."""
    import triton
    import triton.language as tl
    if not _COPY:
        @triton.jit
        def _copy(x, y, n, BLOCK: tl.constexpr):
            i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)
        _COPY.append(_copy)
    y = torch.empty_like(x)
    n = x.numel()
    _COPY[0][(triton.cdiv(n, block),)](x, y, n, BLOCK=block, num_warps=warps)
    return y


def _median_ms(fn, reps):
    for _ in range(10):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,8192,16,128")
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    import triton
    from ula.ops._l2norm import unit_pair
    shape = tuple(int(x) for x in args.shape.split(","))
    q, k = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    nbytes = q.numel() * q.element_size()
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                      "shape": shape}))
    cases = {"torch clone (1 read, 1 write)": (lambda: q.clone(), 2 * nbytes),
             "torch q * 2 (1 read, 1 write)": (lambda: q * 2, 2 * nbytes),
             "torch q + k (2 reads, 1 write)": (lambda: q + k, 3 * nbytes),
             "triton flat copy, 4096 elements, 4 warps (1 read, 1 write)": (lambda: _flat_copy(q), 2 * nbytes),
             "triton flat copy, 16384 elements, 8 warps (1 read, 1 write)": (lambda: _flat_copy(q, 16384, 8),
                                                                             2 * nbytes),
             "unit_pair q, k with 1/|x| (2 reads, 2 writes)": (lambda: unit_pair(q, k), 4 * nbytes)}
    for name, (fn, b) in cases.items():
        ms = _median_ms(fn, args.reps)
        print(f"{ms:8.4f} ms  {b / ms / 1e9:6.2f} TB/s  {name}")


if __name__ == "__main__":
    main()
