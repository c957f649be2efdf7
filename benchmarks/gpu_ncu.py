"""Hardware counters of the core's kernels in one forward+backward (Nsight Compute), for finding what limits them.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \
        python3 benchmarks/gpu_ncu.py --kind vector [--shape 2,8192,16,128,128]

The op runs twice first (compilation, caches), then one forward+backward between cudaProfilerStart/Stop, so
`--profile-from-start off` captures that iteration's kernels alone. Kinds as in gpu_profile.py."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ula.bench import families  # noqa: E402
from ula.bench.measure import forward_backward, ours  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="vector")
    ap.add_argument("--shape", default="2,8192,16,128,128")
    ap.add_argument("--chunk", type=int, default=None)
    a = ap.parse_args()
    shape = tuple(int(x) for x in a.shape.split(","))
    if a.kind in families.CORE_KINDS:
        fn, args = ours(a.kind, *shape, C=a.chunk)
    else:
        fn, args = families.as_args(families.ours(a.kind, a.chunk),
                                    families.make(a.kind, *shape, "cuda", torch.bfloat16))
    fb = forward_backward(fn, args)
    for _ in range(2):
        fb()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fb()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
