"""The H200's own tile choices (ula/core/backends.is_h200) against the H100's, in one process, in turn: forward+
backward medians of CUDA-graph replays and peak memory per op, bf16, B2 T8192 H16 K=V=128 (or --shape), two rounds.

    python3 benchmarks/gpu_h200_tiles.py [--ops gla,gsa,hgrn2] [--rounds 2]   # prints one JSON line per measurement"""
import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.bench import families  # noqa: E402
from ula.bench.measure import graph_times, measure  # noqa: E402
from ula.core import backends  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="gla,gsa,hgrn2")
    ap.add_argument("--shape", default="2,8192,16,128,128")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    dev = torch.device("cuda")
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                          is_h200=backends.is_h200(dev), shape=a.shape)), flush=True)
    shape = tuple(int(x) for x in a.shape.split(","))
    for op in a.ops.split(","):
        torch.manual_seed(0)
        fn, args = families.as_args(families.ours(op), families.make(op, *shape, "cuda", torch.bfloat16))
        outs = {}
        for r in range(a.rounds):
            for tiles in ("h100", "h200"):
                backends._H200[torch.cuda.current_device()] = tiles == "h200"
                with torch.no_grad():
                    outs[tiles] = fn(*args).float()
                _, _, mem = measure(fn, args)
                fwd, fb = graph_times(fn, args)
                print(json.dumps(dict(op=op, round=r, tiles=tiles, fwd_graph_ms=round(fwd, 4),
                                      fwdbwd_graph_ms=round(fb, 4), peak_mib=mem)), flush=True)
        ref = outs["h100"]
        print(json.dumps(dict(op=op, out_diff=((outs["h200"] - ref).norm() / ref.norm()).item())), flush=True)
    backends._H200.clear()


if __name__ == "__main__":
    main()
