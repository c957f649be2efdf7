"""Quick GPU smoke check after a kernel change: every decay kind, both directions, right decay, varlen,
bf16 forward and gradients of backend="triton" against backend="torch" in float64 on the same inputs.

    python3 benchmarks/gpu_smoke.py"""
import sys
import os

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402
from helpers import KINDS, make_inputs  # noqa: E402


def run(inputs, backend, dtype, **kw):
    xs = [None if x is None else (x.to(dtype) if i < 3 else x.double() if dtype == torch.float64 else x)
          .detach().clone().requires_grad_() for i, x in enumerate(inputs)]
    o, S = ula.linear_attention(*xs[:5], initial_state=xs[5], output_final_state=True, backend=backend, **kw)
    g = torch.Generator(device="cuda").manual_seed(1)
    do = torch.randn(o.shape, device="cuda", generator=g, dtype=torch.float64)
    ((o.double() * do).sum() + S.double().sum()).backward()
    return [o] + [x.grad for x in xs if x is not None]


bad = 0
for kind in KINDS:
    for right in (False, True):
        for reverse in (False, True):
            torch.manual_seed(0)
            inputs = [None if x is None else x.cuda() for x in make_inputs(kind, right, 2, 300, 3, 64, 48)]
            inputs[:3] = [x.bfloat16().float() for x in inputs[:3]]
            ref = run(inputs, "torch", torch.float64, reverse=reverse)
            got = run(inputs, "triton", torch.bfloat16, reverse=reverse)
            errs = [((a.double() - b).norm() / b.norm()).item() for a, b in zip(got, ref)]
            ok = all(e < 2e-2 for e in errs)
            bad += not ok
            print(kind, right, reverse, "ok" if ok else "BAD", " ".join(f"{e:.1e}" for e in errs), flush=True)
for kind in ("scalar", "vector"):  # the key gate, applied inside the kernels
    for reverse in (False, True):
        torch.manual_seed(0)
        inputs = [None if x is None else x.cuda() for x in make_inputs(kind, False, 2, 300, 3, 64, 48)]
        inputs[:3] = [x.bfloat16().float() for x in inputs[:3]]
        u = (torch.randn(2, 300, 3, device="cuda") - 1).requires_grad_()
        ref = run(inputs, "torch", torch.float64, reverse=reverse, key_gate=u.double())
        g_ref = u.grad.clone()
        u.grad = None
        got = run(inputs, "triton", torch.bfloat16, reverse=reverse, key_gate=u)
        errs = [((a.double() - b).norm() / b.norm()).item() for a, b in zip(got + [u.grad], ref + [g_ref])]
        ok = all(e < 2e-2 for e in errs)
        bad += not ok
        print(kind, "key_gate", reverse, "ok" if ok else "BAD", " ".join(f"{e:.1e}" for e in errs), flush=True)
print("smoke:", "all ok" if not bad else f"{bad} BAD")
