"""Where the host's time goes in a forward+backward (torch.profiler, CPU and CUDA runtime calls): finds syncs,
allocations and launch cost. python3 benchmarks/gpu_host_trace.py [--cases scalar:128,scalar:64]"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ula.bench.measure import forward_backward, ours  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--cases", default="scalar:128,scalar:64")
ap.add_argument("--shape", default="2,8192,16,128,128")
a = ap.parse_args()
shape = tuple(int(x) for x in a.shape.split(","))
for case in a.cases.split(","):
    kind, c = case.split(":")
    fn, args = ours(kind, *shape, C=None if c == "auto" else int(c))
    fb = forward_backward(fn, args, warm=10)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(10):
            fb()
        torch.cuda.synchronize()
    print(f"== {case}: top host ops by self CPU time (10 f+b)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
