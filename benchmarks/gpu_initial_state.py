"""What an initial state costs: the core's forward and forward+backward with and without `initial_state`, bf16,
per decay kind (median ms, triton.testing.do_bench). Session 8 found the dQ pass ~2x slower with one (two masked
loads and a float32 add per state tile in the output kernel); this measures the fix.

    python3 benchmarks/gpu_initial_state.py [--shape 2,8192,16,128,128] [--kinds none,scalar,vector]
Prints one JSON line per kind, with the device and versions."""
import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,8192,16,128,128")
    ap.add_argument("--kinds", default="none,scalar,vector")
    a = ap.parse_args()
    B, T, H, K, V = (int(x) for x in a.shape.split(","))
    dev = "cuda"
    head = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "shape": [B, T, H, K, V]}
    print(json.dumps(head), flush=True)
    for kind in a.kinds.split(","):
        torch.manual_seed(0)
        q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16) * K ** -0.5
        v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
        shape = {"none": None, "scalar": (B, T, H), "vector": (B, T, H, K)}[kind]
        ld = None if shape is None else torch.nn.functional.logsigmoid(torch.randn(shape, device=dev) + 4.0)
        h0 = torch.randn(B, H, K, V, device=dev) * 0.1
        row = {"kind": kind}
        for name, s0 in (("no_h0", None), ("h0", h0)):
            xs = [x.detach().requires_grad_() if x is not None else None for x in (q, k, v, ld, s0)]
            do = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)

            def fwd():
                return ula.linear_attention(*xs[:4], initial_state=xs[4])[0]

            def fb():
                fwd().backward(do)
            row[name] = {"fwd_ms": round(triton.testing.do_bench(fwd, warmup=10, rep=100, return_mode="median"), 4),
                         "fwd_bwd_ms": round(triton.testing.do_bench(
                             fb, warmup=10, rep=100, grad_to_none=[x for x in xs if x is not None],
                             return_mode="median"), 4)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
