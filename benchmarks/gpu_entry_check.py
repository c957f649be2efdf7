"""The context-parallel entry term's kernels (ula/core/triton/entry.py) on the GPU in bfloat16 against the
PyTorch form in float64, forward and gradients, every left decay kind; one line per kind.

    python3 benchmarks/gpu_entry_check.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.core.cp_entry import add_entry_term, entry_term  # noqa: E402

bad = 0
for decay in ("none", "constant", "scalar", "vector"):
    torch.manual_seed(0)
    B, L, H, K, V = 2, 1000, 4, 128, 128
    g = lambda *s: torch.nn.functional.logsigmoid(torch.randn(*s, device="cuda") + 4)  # noqa: E731
    base = {"none": None, "constant": g(H), "scalar": g(B, L, H, 1), "vector": g(B, L, H, K)}[decay]
    xs = [torch.randn(B, L, H, V, device="cuda"), torch.randn(B, L, H, K, device="cuda"), base,
          torch.randn(B, H, K, V, device="cuda") * 0.1]
    xs[:2] = [x.bfloat16().float() for x in xs[:2]]
    dout = torch.randn(B, L, H, V, device="cuda")
    res = []
    for backend, dt in (("triton", torch.bfloat16), ("torch", torch.float64)):
        leaves = [None if x is None else x.detach().to(dt if i < 2 else torch.float64 if dt == torch.float64
                                                      else torch.float32).requires_grad_() for i, x in enumerate(xs)]
        o, q, gl, E = leaves
        glc = None if gl is None else (gl.view(1, 1, H, 1).expand(1, L, H, 1) if decay == "constant" else gl)
        out = (add_entry_term(o, q, glc, None, E, K ** -0.5, False, "triton") if backend == "triton"
               else o + entry_term(q, glc, None, E, K ** -0.5, False))
        (out.double() * dout).sum().backward()
        res.append([out] + [x.grad for x in leaves if x is not None])
    errs = [((a.double() - b).norm() / b.norm()).item() for a, b in zip(*res)]
    ok = all(e < 2e-2 for e in errs)
    bad += not ok
    print(decay, "ok" if ok else "BAD", " ".join(f"{e:.1e}" for e in errs), flush=True)
print("entry check:", "all ok" if not bad else f"{bad} BAD")
