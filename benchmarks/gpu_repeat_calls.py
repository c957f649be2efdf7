"""Do repeated calls with the same inputs give the same outputs, and is each one as close to float64 as the others?
A configuration's first call takes other paths than the later ones (precompile.py's parallel compile, Triton's own
launch before utils.launch's direct one), so an error in either shows here as a first call unlike the rest.

    python3 benchmarks/gpu_repeat_calls.py [--ops gla,mlstm_exp,...] [--shape 2,1024,4,64,64] [--calls 3]

Per op: each call's output error against the float64 PyTorch path (relative Frobenius norm), and whether every call
is bitwise equal to the first; with --grad the same for the gradients of a forward+backward. One line per op; the
exit status is 1 if any op differs between calls."""
import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.bench import families as fam  # noqa: E402


def check(op, shape, calls=3, grad=False, dev="cuda"):
    """(bitwise the same on every call, [per call: relative error of o (and with grad every gradient) against the
    float64 PyTorch path]) of op on fam.make's inputs at shape (B, T, H, K, V)."""
    x = fam.make(op, *shape, dev, torch.bfloat16 if dev == "cuda" else torch.float32)
    f, ref_f = fam.ours(op, backend="auto" if dev == "cuda" else "triton"), fam.ours(op, backend="torch")
    xd = {n: t.detach().double().requires_grad_() for n, t in x.items()}
    fn, args = fam.as_args(f, x)
    rfn, rargs = fam.as_args(ref_f, xd)
    want = rfn(*rargs)
    do = torch.randn(want.shape, device=want.device)
    wants = [want] + (list(torch.autograd.grad((want * do.double()).sum(), rargs)) if grad else [])
    outs, errs = [], []
    for _ in range(calls):
        o = fn(*args)
        got = [o] + (list(torch.autograd.grad((o.float() * do).sum(), args)) if grad else [])
        outs.append([t.detach().clone() for t in got])
        errs.append([float(f"{((g.double() - w).norm() / w.norm()).item():.3e}") for g, w in zip(got, wants)])
    same = all(all(torch.equal(p, q) for p, q in zip(outs[0], o)) for o in outs[1:])
    return same, errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default=",".join(fam.CORE_KINDS + fam.FAMILIES))
    ap.add_argument("--shape", default="2,1000,4,64,64")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--grad", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run on Triton's interpreter")
    a = ap.parse_args()
    shape = tuple(int(v) for v in a.shape.split(","))
    dev = a.device
    print(json.dumps(dict(device=torch.cuda.get_device_name() if dev == "cuda" else dev, torch=torch.__version__,
                          triton=triton.__version__, shape=shape)), flush=True)
    bad = 0
    for op in a.ops.split(","):
        same, errs = check(op, shape, a.calls, a.grad, dev)
        bad += not same
        print(json.dumps(dict(op=op, bitwise_same=same, errors_per_call=errs)), flush=True)
    print("repeat calls:", "all the same" if not bad else f"{bad} ops differ between calls")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
