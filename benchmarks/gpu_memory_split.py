"""Where the core's peak memory goes as T grows (issue 7's memory bar compares T and T/2): for each T, the bytes
allocated after the inputs, after the forward (and its peak), and the peak of the backward, bf16, B=1 H=16
K=V=128, one JSON line per (kind, T).

    python3 benchmarks/gpu_memory_split.py [--kinds scalar,vector] [--T 131072,262144]"""
import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_context_parallel import make  # noqa: E402
import ula  # noqa: E402

GiB = 2 ** 30


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="scalar,vector")
    ap.add_argument("--T", default="131072,262144")
    a = ap.parse_args()
    dev = torch.device("cuda")
    for kind in a.kinds.split(","):
        for T in map(int, a.T.split(",")):
            torch.cuda.empty_cache()
            q, k, v, ld = make(kind, 1, T, dev, 0)
            xs = [x.requires_grad_() for x in (q, k, v)] + [None if ld is None else ld.requires_grad_()]
            for _ in range(2):  # warm-up: compile and cache
                o, _ = ula.linear_attention(*xs)
                o.backward(torch.ones_like(o))
                for x in xs:
                    if x is not None:
                        x.grad = None
            del o
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            r = {"kind": kind, "T": T, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "triton": triton.__version__, "inputs_GiB": torch.cuda.memory_allocated() / GiB}
            o, _ = ula.linear_attention(*xs)
            torch.cuda.synchronize()
            r["after_forward_GiB"] = torch.cuda.memory_allocated() / GiB
            r["forward_peak_GiB"] = torch.cuda.max_memory_allocated() / GiB
            torch.cuda.reset_peak_memory_stats()
            do = torch.ones_like(o)
            o.backward(do)
            torch.cuda.synchronize()
            r["backward_peak_GiB"] = torch.cuda.max_memory_allocated() / GiB
            r["after_backward_GiB"] = torch.cuda.memory_allocated() / GiB
            print(json.dumps({k: round(x, 3) if isinstance(x, float) else x for k, x in r.items()}), flush=True)
            del o, do, xs, q, k, v, ld


if __name__ == "__main__":
    main()
