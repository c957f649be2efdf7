"""Where a warm eager forward+backward waits for the GPU (session 37: ABC's and GSA's host-time loop had one submit
of ~1 s in 50, i.e. a wait for the queued sleep kernel; linear's none).

    python3 benchmarks/gpu_host_wait_probe.py [--ops abc,gsa,linear] [--shape 2,8192,16,128,128]

Per op: one warm f+b under torch.cuda's sync debug mode ("warn": synchronizing torch calls), then 50 submits behind a
~1 s sleep kernel with the submit times over 50 ms and the caching allocator's counters (device allocations, frees,
retries: a cudaFree waits for the device) before and after, and the GPU kernels (and memsets) one f+b launches
(torch.profiler): a launch blocks once the stream's queue of pending work is full, which the first slow submit's
index times the launches per f+b shows. One JSON line per op."""
import argparse
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.bench import families  # noqa: E402
from ula.bench.measure import forward_backward  # noqa: E402

KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def counters():
    s = torch.cuda.memory_stats()
    return {k: s.get(k) for k in KEYS} | {"reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="abc,gsa,linear")
    ap.add_argument("--shape", default="2,8192,16,128,128")
    a = ap.parse_args()
    B, T, H, K, V = (int(x) for x in a.shape.split(","))
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, shape=a.shape)))
    for op in a.ops.split(","):
        fn, args = families.as_args(families.ours(op), families.make(op, B, T, H, K, V, "cuda", torch.bfloat16))
        fb = forward_backward(fn, args)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fb()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        syncs = sorted({str(w.message)[:160] for w in caught if "synchroniz" in str(w.message).lower()})
        torch.cuda.synchronize()
        before = counters()
        torch.cuda._sleep(int(2e9))
        slow = []
        for i in range(50):
            t0 = time.perf_counter()
            fb()
            ms = (time.perf_counter() - t0) * 1e3
            if ms > 50:
                slow.append((i, round(ms, 1), counters()))
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fb()
            torch.cuda.synchronize()
        gpu_events = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
        first = slow[0][0] if slow else None
        print(json.dumps(dict(op=op, sync_warnings=syncs, before=before, after=counters(), slow_submits=slow,
                              gpu_events_per_fb=gpu_events,
                              queued_before_first_wait=None if first is None else first * gpu_events)))
        del fn, args, fb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
