"""ABC's cumulative softmax on its Triton kernels (the interpreter, float32) against its float64 PyTorch form: the
relative error of dw and dz0 over 3000 steps, logits of scale 3, 100 and ±1e4, z0 ~ N(0, 1).

    TRITON_INTERPRET=1 PYTHONPATH=.:tests python3 benchmarks/cpu_abc_softmax_precision.py

(session 37: the backward from φ, whose factors 1 − φ are exact to ~6e-8 absolute, against the one before it, run
with PYTHONPATH pointing at that tree: benchmarks/cpu_abc_softmax_precision.txt)."""
import platform

import torch

import ula
from helpers import rel
from ula.ops.gsa import _cumulative_softmax


def main():
    print(f"ula at {ula.__file__}; torch {torch.__version__}; {platform.machine()} {platform.processor()}")
    torch.manual_seed(0)
    for scale in (3.0, 100.0, 1e4):
        w = torch.randn(1, 3000, 1, 4) * scale
        if scale == 1e4:
            w = torch.randint(-1, 2, w.shape).float() * 1e4
        w.requires_grad_()
        z0 = torch.randn(1, 1, 4).requires_grad_()
        gp, gz = torch.randn(w.shape), torch.randn(1, 1, 4)
        grads = []
        for backend, ww, zz in (("triton", w, z0), ("torch", w.double(), z0.double())):
            phi, zT = _cumulative_softmax(ww, zz, None, backend)
            loss = (phi * gp.to(phi.dtype)).sum() + (zT * gz.to(zT.dtype)).sum()
            grads.append(torch.autograd.grad(loss, [w, z0]))
        print(f"logits scale {scale:g}: dw rel {rel(grads[0][0], grads[1][0]):.2e}, "
              f"dz0 rel {rel(grads[0][1], grads[1][1]):.2e}")


if __name__ == "__main__":
    main()
