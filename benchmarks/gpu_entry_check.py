"""The context-parallel entry term's kernels (ula/core/triton/entry.py) on the GPU in bfloat16 against the
PyTorch form in float64, forward and gradients, every left decay kind, and with mLSTMexp's normalizer column beside
the state (no decay per feature there): the values' terms within bfloat16's error, the column's (its term and its
state's gradient) within float32's; one line per case.

    python3 benchmarks/gpu_entry_check.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.core.cp_entry import add_entry_term, entry_term  # noqa: E402

bad = 0
cases = [(d, False) for d in ("none", "constant", "scalar", "vector")] + [(d, True) for d in ("none", "scalar")]
for decay, col in cases:
    torch.manual_seed(0)
    B, L, H, K, V = 2, 1000, 4, 128, 128
    g = lambda *s: torch.nn.functional.logsigmoid(torch.randn(*s, device="cuda") + 4)  # noqa: E731
    base = {"none": None, "constant": g(H), "scalar": g(B, L, H, 1), "vector": g(B, L, H, K)}[decay]
    xs = [torch.randn(B, L, H, V, device="cuda"), torch.randn(B, L, H, K, device="cuda"), base,
          torch.randn(B, H, K, V, device="cuda") * 0.1, torch.randn(B, L, H, device="cuda"),
          torch.randn(B, H, K, 1, device="cuda") * 0.1]
    xs[:2] = [x.bfloat16().float() for x in xs[:2]]
    dout, dden = torch.randn(B, L, H, V, device="cuda"), torch.randn(B, L, H, device="cuda")
    res = []
    for backend, dt in (("triton", torch.bfloat16), ("torch", torch.float64)):
        leaves = [None if x is None else x.detach().to(dt if i < 2 else torch.float64 if dt == torch.float64
                                                      else torch.float32).requires_grad_() for i, x in enumerate(xs)]
        o, q, gl, E, den, En = leaves
        glc = None if gl is None else (gl.view(1, 1, H, 1).expand(1, L, H, 1) if decay == "constant" else gl)
        if backend == "triton":
            got = add_entry_term(o, q, glc, None, E, K ** -0.5, False, "triton", column=(den, En) if col else None)
        else:
            got = o + entry_term(q, glc, None, E, K ** -0.5, False)
            if col:
                got = (got, den + entry_term(q, glc, None, En, K ** -0.5, False)[..., 0])
        out, n = got if col else (got, None)
        loss = (out.double() * dout).sum() + ((n.double() * dden).sum() if col else 0)
        loss.backward()
        res.append([out, n, E.grad, En.grad if col else None]
                   + [x.grad for x in (o, q, gl) if x is not None])
    errs = [None if b is None else ((a.double() - b).norm() / b.norm()).item() for a, b in zip(*res)]
    tols = [2e-2, 1e-5, 2e-2, 1e-5] + [2e-2] * (len(errs) - 4)  # the column's two within float32's error
    ok = all(e is None or e < t for e, t in zip(errs, tols))
    bad += not ok
    print(decay, "column" if col else "", "ok" if ok else "BAD", " ".join(f"{e:.1e}" for e in errs if e is not None),
          flush=True)
print("entry check:", "all ok" if not bad else f"{bad} BAD")
