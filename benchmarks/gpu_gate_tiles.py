"""mLSTMexp's gate scan (ula/ops/_mlstm_gate_kernels.py), forward and backward kernels timed under several tilings
(steps per block BT, heads per program BH, warps[, NC summaries read at a time]). The parallel kernels (the
default, PARALLEL = True: two launches each way, a program per block of BT steps) trade programs against the
carries each block reads from the others' summaries and coalescing ([B, T, H] rows are H apart); with
--sequential, the first version's kernels too (PARALLEL = False: one program walks each sequence, so its time is
the number of blocks times a block's latency), at their default tiling and at --seq-tiles.

    python3 benchmarks/gpu_gate_tiles.py [--shape 2,8192,16] [--tiles 512,1,4/256,1,4/...] [--sequential]

Prints one line per tiling: median ms (the backward's as forward+backward minus forward) (triton.testing.do_bench of
CUDA-graph replays: a couple of kernels each, shorter than the host's time to launch them) of the forward and of the
backward, and the largest difference of the outputs and gradients from the parallel default tiling's, relative to
each tensor's largest value: rounding only (the sums of logσ(f) and of the gradients' carries are associated by
block), so ~1e-13 or below for the float64 m and m_T; the float32 ld', logw and the bfloat16 gradients may differ by
one rounding step of their dtype where the float64 value lies on a boundary (up to ~4e-3 relative to an element,
less to the tensor's max)."""
import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.bench.measure import replay_ms  # noqa: E402
from ula.core.triton.utils import set_tuning  # noqa: E402
from ula.ops import _mlstm_gate_kernels as gates  # noqa: E402


def rel_diff(got, ref):
    """Per tensor, the largest difference relative to the reference's largest magnitude; the worst of them."""
    return max(((x - y).abs().max() / y.abs().max().clamp_min(1e-300)).item() for x, y in zip(got, ref))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,8192,16")
    ap.add_argument("--tiles", default="1024,1,8/512,1,4/512,1,8/256,1,4/128,1,4/256,2,4/128,4,4/64,16,4/512,1,4,32")
    ap.add_argument("--sequential", action="store_true", help="time the sequential kernels (PARALLEL = False) too")
    ap.add_argument("--seq-tiles", default="2048,1,8/1024,1,8")
    a = ap.parse_args()
    B, T, H = (int(x) for x in a.shape.split(","))
    torch.manual_seed(0)
    dev = "cuda"
    i = (torch.randn(B, T, H, device=dev) - 2).bfloat16().requires_grad_()
    f = (torch.randn(B, T, H, device=dev) + 4).bfloat16().requires_grad_()
    grads = [torch.randn(B, T, H, device=dev) for _ in range(3)]
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                          shape=[B, T, H])))
    runs = [(True, None)] + [(True, t) for t in a.tiles.split("/") if t]
    if a.sequential:
        runs += [(False, None)] + [(False, t) for t in a.seq_tiles.split("/") if t]
    ref = None
    for parallel, tiles in runs:
        gates.PARALLEL = parallel
        set_tuning("mlstm_gates", tiles)
        with torch.no_grad():  # no autograd graph kept alive here: its nodes' stream would break the captures below
            outs = gates.mlstm_exp_gates(i, f, out_dtype=torch.float32)

        def fwd():
            return gates.mlstm_exp_gates(i, f, out_dtype=torch.float32)

        def fwd_bwd():  # the forward inside: autograd runs a backward on its forward's stream, which must be captured
            o = gates.mlstm_exp_gates(i, f, out_dtype=torch.float32)
            return torch.autograd.grad(o[:3], (i, f), grads)

        got = [x.double() for x in list(outs) + list(fwd_bwd())]
        diff = None if ref is None else rel_diff(got, ref)
        ref = ref or got
        t_f = replay_ms(fwd, rep=200)
        t_b = replay_ms(fwd_bwd, rep=200) - t_f
        name = ("parallel " if parallel else "sequential ") + (tiles or "default")
        print(f"{name:28s} forward {t_f:.4f} ms  backward {t_b:.4f} ms  max rel diff {diff}", flush=True)
    set_tuning("mlstm_gates", None)
    gates.PARALLEL = True


if __name__ == "__main__":
    main()
