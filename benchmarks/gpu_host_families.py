"""Host (Python + launch) time of each family's forward+backward against its GPU time, one GPU, bf16.

    python3 benchmarks/gpu_host_families.py [--ops normalized,mlstm_exp,...] [--shape 2,8192,16,128,128] [--profile]
        [--compile]

Per op: the GPU time (CUDA-graph replays of one f+b), the host's median submit time per f+b (a loop of 50 with
the GPU kept busy: a spin kernel queued first so no launch waits; the slowest submit and its index show a call
that waited for the GPU, or one that found the stream's queue full: about 1000 pending kernels, ABC's 22nd call at
46 kernels per f+b, benchmarks/gpu_host_wait_probe.py), and eager wall time per f+b; an op whose host time
exceeds its GPU time runs at the host's speed in an eager training loop. --profile adds cProfile's top functions
(own time) per op; --compile times each op under torch.compile(fullgraph=True) (default mode: no CUDA graphs), after
forward_backward's warm-up calls; --profile then also lists the top functions by cumulative time. Prints one JSON line per op."""
import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.bench import families  # noqa: E402
from ula.bench.measure import forward_backward, graph_times  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_profile import host_top  # noqa: E402  (cProfile's top functions, shared with gpu_profile.py --host)


def host_ms(fb, n=50):
    """Median submit time per f+b with the GPU busy (a long sleep kernel queued first), the slowest submit (one
    that waited for the GPU: a host sync, or a full launch queue), then wall time per f+b."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of GPU cycles: every launch below queues without waiting
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fb()
        ts.append((time.perf_counter() - t0) * 1e3)
    submit, slowest = sorted(ts)[n // 2], max(ts)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fb()
    torch.cuda.synchronize()
    return submit, slowest, ts.index(slowest), (time.perf_counter() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="linear,normalized,mlstm_sig,mlstm_exp,gla,gsa")
    ap.add_argument("--shape", default="2,8192,16,128,128")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    B, T, H, K, V = (int(x) for x in a.shape.split(","))
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                          shape=a.shape, compiled=a.compile)))
    for op in a.ops.split(","):
        fn, args = families.as_args(families.ours(op), families.make(op, B, T, H, K, V, "cuda", torch.bfloat16))
        if a.compile:
            torch._dynamo.reset()
            fn = torch.compile(fn, fullgraph=True)
        fb = forward_backward(fn, args)
        submit, slowest, at, wall = host_ms(fb)  # before any graph capture (its pool changes the allocator's state)
        gpu = graph_times(fn, args)
        row = dict(op=op, compiled=a.compile, gpu_graph_fb_ms=round(gpu[1], 3), host_submit_fb_ms=round(submit, 3),
                   slowest_submit_ms=round(slowest, 3), slowest_at=at, eager_wall_fb_ms=round(wall, 3),
                   host_bound=submit > gpu[1])
        if a.profile:
            row["cprofile_top_own"] = host_top(fb, k=14)[1]
            if a.compile:
                row["cprofile_top_cum"] = host_top(fb, k=30, by_cum=True)[1]
        print(json.dumps(row))
        del fn, args, fb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
