"""Where the host's Python time goes in a forward+backward (cProfile, no synchronization inside the loop), and
what one Triton launch costs on the host. python3 benchmarks/gpu_host_profile.py [--cases scalar:128]"""
import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ula.bench.measure import forward_backward, ours  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--cases", default="none:auto,scalar:128")
ap.add_argument("--shape", default="2,8192,16,128,128")
ap.add_argument("--rows", type=int, default=30)
ap.add_argument("--cumulative", action="store_true")
a = ap.parse_args()
shape = tuple(int(x) for x in a.shape.split(","))
for case in a.cases.split(","):
    kind, c = case.split(":")
    fn, args = ours(kind, *shape, C=None if c == "auto" else int(c))
    fb = forward_backward(fn, args, warm=10)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9 * 0.5))  # the GPU busy so the host never waits on a full queue
    n = 30
    t0 = time.perf_counter()
    for _ in range(n):
        fb()
    host = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9 * 0.5))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fb()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    print(f"== {case}: host {host:.3f} ms per f+b (no profiler); cProfile per {n} f+b:")
    st.sort_stats("tottime").print_stats(a.rows)
    if a.cumulative:
        st.sort_stats("cumulative").print_stats(a.rows)
    print(s.getvalue())
