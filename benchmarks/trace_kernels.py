"""Summarize a Chrome trace of torch.profiler (e.g. gpu_cp_profile.py --trace): the GPU's span and busy time, its
kernels by total time, and (--order) every kernel in order with the idle gaps before it.

    python benchmarks/trace_kernels.py TRACE.json [--order] [--top 25]
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--order", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    t0 = gpu[0]["ts"]
    span = (max(e["ts"] + e["dur"] for e in gpu) - t0) / 1e3
    print(f"{a.trace}: GPU span {span:.3f} ms, busy {sum(e['dur'] for e in gpu) / 1e3:.3f} ms")
    total = collections.defaultdict(lambda: [0, 0.0])
    for e in gpu:
        total[e["name"][:70]][0] += 1
        total[e["name"][:70]][1] += e["dur"] / 1e3
    print("   ms  calls  kernel")
    for name, (n, ms) in sorted(total.items(), key=lambda x: -x[1][1])[:a.top]:
        print(f"{ms:7.3f} {n:5d}  {name}")
    if a.order:
        end = t0
        print("\n  start     ms  gap before  kernel")
        for e in gpu:
            gap = (e["ts"] - end) / 1e3
            gap = gap if gap > 0.02 else 0
            print(f"{(e['ts'] - t0) / 1e3:8.3f} {e['dur'] / 1e3:6.3f} {gap:8.3f}  {e['name'][:70]}")
            end = max(end, e["ts"] + e["dur"])


if __name__ == "__main__":
    main()
