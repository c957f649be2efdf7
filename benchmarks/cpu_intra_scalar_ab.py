"""The PyTorch path's forward+backward at `ula demo`'s shape (B32 T64 H2 K=V=32, one thread) with
`chunk_torch._intra_scalar` from this tree against another file's (a parent tree's), interleaved call by call in one
process: median milliseconds per call, for no decay, a constant decay and a decay per step.

    python3 benchmarks/cpu_intra_scalar_ab.py PARENT_chunk_torch.py [REPS]"""
import importlib.util
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import ula
import ula.core.chunk_torch as here


def main():
    spec = importlib.util.spec_from_file_location("ula.core._parent_chunk_torch", sys.argv[1])  # its relative imports
    parent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parent)
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, T, H, D = 32, 64, 2, 32
    q, k, v = (torch.randn(B, T, H, D, requires_grad=True) for _ in range(3))
    decays = {"none": None, "constant": F.logsigmoid(torch.randn(H) + 3),
              "scalar": F.logsigmoid(torch.randn(B, T, H) + 3)}
    forms = {"this tree": here._intra_scalar, "parent": parent._intra_scalar}
    print(f"torch {torch.__version__}, B{B} T{T} H{H} K=V={D}, {reps} calls each, interleaved")
    for name, ld in decays.items():
        times = {f: [] for f in forms}
        for i in range(reps + 10):
            for f, fn in forms.items():
                here._intra_scalar = fn
                t = time.perf_counter()
                o = ula.linear_attention(q, k, v, ld, chunk_size=64, backend="torch")[0]
                o.sum().backward()
                if i >= 10:
                    times[f].append((time.perf_counter() - t) * 1e3)
        here._intra_scalar = forms["this tree"]
        med = {f: statistics.median(x) for f, x in times.items()}
        print(f"{name:9s} f+b ms: this tree {med['this tree']:.3f}, parent {med['parent']:.3f}, "
              f"ratio {med['this tree'] / med['parent']:.3f}")


if __name__ == "__main__":
    main()
