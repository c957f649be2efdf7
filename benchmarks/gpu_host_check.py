"""Is a forward+backward bound by the host (Python + launches) or by the GPU? Per decay kind and chunk size:
do_bench median twice (the spread), the host's submit time per f+b (a loop of 50 without synchronizing), the
wall time per f+b of that loop once the GPU is done, and the GPU kernel time per f+b (CUDA events around 50
f+b submitted after the queue is full, which hides the host).

    python3 benchmarks/gpu_host_check.py [--cases none:auto,scalar:64,scalar:128] [--shape 2,8192,16,128,128]"""
import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ula.bench.measure import forward_backward, ours  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="none:auto,constant:auto,scalar:64,scalar:128,scalar:256,vector:auto")
    ap.add_argument("--shape", default="2,8192,16,128,128")
    a = ap.parse_args()
    shape = tuple(int(x) for x in a.shape.split(","))
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                          shape=shape)))
    for case in a.cases.split(","):
        kind, c = case.split(":")
        fn, args = ours(kind, *shape, C=None if c == "auto" else int(c))
        fb = forward_backward(fn, args, warm=5)
        torch.cuda.synchronize()
        t1 = triton.testing.do_bench(fb, warmup=25, rep=100, return_mode="median")
        t2 = triton.testing.do_bench(fb, warmup=25, rep=100, return_mode="median")
        n = 50
        torch.cuda.synchronize()
        w0 = time.perf_counter()
        for _ in range(n):
            fb()
        submit = (time.perf_counter() - w0) / n * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - w0) / n * 1e3
        # GPU time: queue a long kernel first so the host runs ahead, then time the f+b's with events
        big = torch.empty(1 << 28, device="cuda")
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(2e9 * 0.1))  # ~100 ms of GPU spin (cycles at ~2 GHz)
        e0.record()
        for _ in range(20):
            fb()
        e1.record()
        torch.cuda.synchronize()
        gpu = e0.elapsed_time(e1) / 20
        del big
        print(f"{kind:9s} chunk {c:>4s}: do_bench {t1:.3f} / {t2:.3f} ms; host submit {submit:.3f} ms/f+b; "
              f"wall {wall:.3f} ms/f+b; GPU-only {gpu:.3f} ms/f+b", flush=True)
        del fn, args, fb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
