"""Packed sequences (cu_seqlens) through a stack of layers, eagerly: does the host wait for the GPU?

A packed call needs cu_seqlens' values on the host (grid sizes, layouts), and reading them waits for the GPU's queue.
ula/core/cu_cache.py reads them once per tensor; before it, every op read them in its forward and again in its
backward. This times forward+backward of L calls that share one cu_seqlens (as a model's L layers do), medians of
triton.testing.do_bench, bf16, K=V=128, and the same tokens unpacked (B rows) where the lengths are equal.

    python3 benchmarks/gpu_packed_layers.py [--layers 4] [--shapes "16384+16384,8;2048x8,16"]
        [--ops linear,gla,mlstm_exp,normalized,abc] [--out packed_layers.json]

A shape is "L1+L2+...,H" or "LxN,H" (N sequences of L). Writes $OUT/<--out> with the device line and
library versions, and prints a table."""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402
from record import header  # noqa: E402


def layer_inputs(op, B, T, H, L, D=128):
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for _ in range(L):
        def r(*s, sc=1.0):
            return (torch.randn(*s, device="cuda", generator=g) * sc).to(torch.bfloat16).requires_grad_()
        xs = [r(B, T, H, D, sc=D ** -0.5), r(B, T, H, D, sc=D ** -0.5), r(B, T, H, D)]
        if op == "gla":
            xs.append(F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=g) + 4).requires_grad_())
        if op == "mlstm_exp":
            xs += [(torch.randn(B, T, H, device="cuda", generator=g) - 2).requires_grad_(),
                   (torch.randn(B, T, H, device="cuda", generator=g) + 4).requires_grad_()]
        if op == "abc":  # 64 slots' logits
            xs.append(torch.randn(B, T, H, 64, device="cuda", generator=g).to(torch.bfloat16).requires_grad_())
        out.append(xs)
    return out


def call(op, xs, cu):
    if op == "linear":
        return ula.linear_attention(*xs, cu_seqlens=cu)[0]
    if op == "gla":
        return ula.gla(*xs, cu_seqlens=cu)[0]
    if op == "mlstm_exp":
        return ula.mlstm(*xs, variant="exp", cu_seqlens=cu)[0]
    if op == "normalized":
        return ula.normalized_linear_attention(*xs, cu_seqlens=cu)[0]
    if op == "abc":
        return ula.abc(*xs, cu_seqlens=cu)[0]
    raise ValueError(op)


def time_stack(op, layers, cu):
    leaves = [x for xs in layers for x in xs]

    def fb():
        sum(call(op, xs, cu).float().sum() for xs in layers).backward()

    def fwd():
        with torch.no_grad():
            for xs in layers:
                call(op, xs, cu)

    fb()
    t_f = triton.testing.do_bench(fwd, warmup=25, rep=200, return_mode="median")
    t_fb = triton.testing.do_bench(fb, warmup=25, rep=200, return_mode="median", grad_to_none=leaves)
    return t_f, t_fb


def packed_shape(shape):
    """A shape "L1+L2+...,H" or "LxN,H" (N sequences of L) -> (the lengths, H, cu_seqlens int32 on the GPU)."""
    lens, H = shape.split(",")
    if "x" in lens:
        n, count = lens.split("x")
        lens = [int(n)] * int(count)
    else:
        lens = [int(x) for x in lens.split("+")]
    return lens, int(H), torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--shapes", default="16384+16384,8;2048x8,16")
    ap.add_argument("--ops", default="linear,gla,mlstm_exp,normalized")
    ap.add_argument("--out", default="packed_layers.json", help="file name under $OUT")
    a = ap.parse_args()
    res = header()
    print(res["device"], res["torch"], res["triton"], flush=True)
    for shape in a.shapes.split(";"):
        lens, H, cu = packed_shape(shape)
        T = sum(lens)
        for op in a.ops.split(","):
            row = dict(op=op, lens=lens, H=H, layers=a.layers)
            row["packed_fwd_ms"], row["packed_fb_ms"] = time_stack(op, layer_inputs(op, 1, T, H, a.layers), cu)
            if len(set(lens)) == 1:  # the same tokens as batch rows
                row["rows_fwd_ms"], row["rows_fb_ms"] = time_stack(
                    op, layer_inputs(op, len(lens), lens[0], H, a.layers), None)
            res["results"].append(row)
            print(f"{shape} {op:10s} packed f / f+b {row['packed_fwd_ms']:.3f} / {row['packed_fb_ms']:.3f} ms"
                  + (f", rows {row['rows_fwd_ms']:.3f} / {row['rows_fb_ms']:.3f}" if "rows_fb_ms" in row else ""),
                  flush=True)
            with open(os.path.join(os.environ.get("OUT", "/tmp"), a.out), "w") as fh:
                json.dump(res, fh, indent=1)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
