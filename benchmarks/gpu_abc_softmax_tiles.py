"""ABC's cumulative softmax alone (ula/ops/_abc_softmax_kernels.py): forward and forward+backward medians of
CUDA-graph replays per tiling (steps BT, slots BM, warps, pieces; `ULA_TUNE_ABC_SOFTMAX` by hand), φ against the
PyTorch form's (float64 logcumsumexp; ABC's totals time it).
B2 T8192 H16 m = 64, w bf16 (a projection's output), φ float32, no initial state.
Run: PYTHONPATH=. python3 benchmarks/gpu_abc_softmax_tiles.py [--tiles "64,16,4;256,16,4"] [--shape B,T,H,M]"""
import argparse

import torch
import triton

from ula.bench.measure import graph_times
from ula.core.triton.utils import set_tuning
from ula.ops.gsa import _cumulative_softmax


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default="64,16,2,64;64,32,4,64;128,16,4,64;32,16,1,64;64,8,1,64")
    ap.add_argument("--shape", default="2,8192,16,64")
    a = ap.parse_args()
    B, T, H, M = (int(x) for x in a.shape.split(","))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, "shape", a.shape,
          flush=True)
    torch.manual_seed(0)
    w = (torch.randn(B, T, H, M, device="cuda") * 3).bfloat16().requires_grad_()
    with torch.no_grad():  # (a graph kept alive holds w's AccumulateGrad from the default stream: no capture then)
        ref = _cumulative_softmax(w, None, None, "torch")[0]
    for cfg in a.tiles.split(";"):
        set_tuning("abc_softmax", cfg)
        fn = lambda w: _cumulative_softmax(w, None, None, "triton")[0]  # noqa: E731
        with torch.no_grad():
            err = f", max |φ - torch's| {(fn(w) - ref).abs().max().item():.1e}"
        fwd, fb = graph_times(fn, (w,))
        print(f"{cfg}: forward {fwd:.3f} ms, forward+backward {fb:.3f} ms{err}", flush=True)


if __name__ == "__main__":
    main()
