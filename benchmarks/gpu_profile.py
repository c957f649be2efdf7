"""Where the time of one forward+backward goes: GPU time per kernel (torch.profiler), per decay kind.

    python3 benchmarks/gpu_profile.py [--kinds none,constant,scalar,vector] [--shape 2,8192,16,128,128]
(kinds may also name ops of ula.bench.families: gla, mlstm_exp, normalized, gsa, ...)

Prints, for each kind, the median f+b time and a table of kernels (calls, total ms over 5 iterations / 5); with
--ordered also one iteration's launches in order."""
import argparse
import json
import os
import sys
from collections import defaultdict

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ula.bench import families  # noqa: E402
from ula.bench.measure import forward_backward, measure, ours  # noqa: E402


def profile(fn, args, iters=5):
    fb = forward_backward(fn, args)
    torch.cuda.synchronize()
    t = triton.testing.do_bench(fb, warmup=10, rep=50, return_mode="median")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fb()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += 1
            per[e.name][1] += e.device_time_total / 1e3
    rows = sorted(((n, c // iters, ms / iters) for n, (c, ms) in per.items()), key=lambda r: -r[2])
    # one iteration's launches in order (the last fifth of the events by start time)
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    n = len(ev) // iters
    order = [(e.name, e.device_time_total / 1e3) for e in ev[-n:]] if n else []
    return t, rows, fb, order


def host_top(fb, iters=20, k=18, by_cum=False):
    """cProfile over iters calls of fb: (Python ms per call, the top k functions by own (or cumulative) time as lines
    of ms per call). Also benchmarks/gpu_host_families.py's."""
    import cProfile
    import pstats
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(iters):
        fb()
    pr.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(pr)
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][3 if by_cum else 2])[:k]
    return st.total_tt / iters * 1e3, [f"{tt / iters * 1e3:7.3f} own {ct / iters * 1e3:7.3f} cum x{nc // iters:<4d} "
                                       f"{os.path.basename(fname)}:{line}({func})"
                                       for (fname, line, func), (cc, nc, tt, ct, _) in top]


def host_profile(fb, iters=20):
    """Python time of one forward+backward (launch overhead): cProfile over iters calls, top functions."""
    total, lines = host_top(fb, iters)
    print(f"  host: {total:.3f} ms per f+b in Python; top by own time (ms per f+b):")
    for line in lines:
        print("  " + line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="none,constant,scalar,vector")
    ap.add_argument("--shape", default="2,8192,16,128,128")
    ap.add_argument("--host", action="store_true", help="also profile the Python (launch) side")
    ap.add_argument("--ordered", action="store_true", help="also list one iteration's launches in order")
    ap.add_argument("--chunk", type=int, default=None, help="chunk size (default: the heuristic's)")
    a = ap.parse_args()
    shape = tuple(int(x) for x in a.shape.split(","))
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                          shape=shape, env={k: v for k, v in os.environ.items() if k.startswith("ULA_")})))
    for kind in a.kinds.split(","):
        if kind not in families.CORE_KINDS:  # an op of ula.ops (ula.bench.families)
            fn, args = families.as_args(families.ours(kind, a.chunk), families.make(kind, *shape, "cuda",
                                                                                   torch.bfloat16))
        else:
            fn, args = ours(kind, *shape, C=a.chunk)
        t, rows, fb, order = profile(fn, args)
        _, _, peak = measure(fn, args)
        print(f"== {kind} chunk {a.chunk or 'auto'}: f+b {t:.3f} ms (median), peak {peak:.0f} MiB; "
              f"GPU kernels sum {sum(r[2] for r in rows):.3f} ms; per iteration:")
        for n, c, ms in rows[:14]:
            print(f"  {ms:7.3f} ms  x{c:<3d} {n[:110]}")
        if a.ordered:
            print("  one iteration in launch order:")
            for n, ms in order:
                print(f"    {ms:7.3f} ms  {n[:100]}")
        if a.host:
            host_profile(fb)
        del fn, args
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
