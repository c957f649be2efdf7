"""mLSTMexp's gate scan (ula/ops/_mlstm_gate_kernels.py), forward and backward kernels timed under several tilings
(steps per block BT, heads per program BH, warps): the walk along T is sequential per program, so the choice trades
block latency against programs and coalescing ([B, T, H] rows are H apart).

    python3 benchmarks/gpu_gate_tiles.py [--shape 2,8192,16] [--tiles 2048,1,8/1024,1,8/512,2,4/256,4,4/128,16,4]

Prints one line per tiling: median ms (triton.testing.do_bench of CUDA-graph replays: one kernel each, shorter
than the host's time to launch it) of the forward and of the backward, and the largest difference of the outputs
and gradients from the default tiling's (0 expected: same arithmetic)."""
import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.core.triton.utils import set_tuning  # noqa: E402
from ula.ops._mlstm_gate_kernels import mlstm_exp_gates  # noqa: E402


def replay_ms(fn):
    """Median ms of CUDA-graph replays of fn (warmed up on a side stream first, as capture wants)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,8192,16")
    ap.add_argument("--tiles", default="2048,1,8/1024,1,8/512,1,4/512,2,4/256,4,4/128,8,4/128,16,4")
    a = ap.parse_args()
    B, T, H = (int(x) for x in a.shape.split(","))
    torch.manual_seed(0)
    dev = "cuda"
    i = (torch.randn(B, T, H, device=dev) - 2).bfloat16().requires_grad_()
    f = (torch.randn(B, T, H, device=dev) + 4).bfloat16().requires_grad_()
    grads = [torch.randn(B, T, H, device=dev) for _ in range(3)]
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                          shape=[B, T, H])))
    ref = None
    for tiles in [None] + a.tiles.split("/"):
        set_tuning("mlstm_gates", tiles)
        outs = mlstm_exp_gates(i, f, out_dtype=torch.float32)

        def fwd():
            return mlstm_exp_gates(i, f, out_dtype=torch.float32)

        def bwd():
            return torch.autograd.grad(outs[:3], (i, f), grads, retain_graph=True)

        got = [x.double() for x in list(outs) + list(bwd())]
        diff = None if ref is None else max((x - y).abs().max().item() for x, y in zip(got, ref))
        ref = ref or got
        t_f, t_b = replay_ms(fwd), replay_ms(bwd)
        print(f"tiles {tiles or 'default':12s} forward {t_f:.4f} ms  backward {t_b:.4f} ms  max diff {diff}",
              flush=True)
    set_tuning("mlstm_gates", None)


if __name__ == "__main__":
    main()
