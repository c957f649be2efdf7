"""GPU check of the Triton backend: accuracy of forward and gradients in bfloat16, then speed and peak memory.

Run on a CUDA machine from the repository root:

    python benchmarks/gpu_check_triton.py            # writes $OUT/gpu_check_triton.json (OUT defaults to /tmp)

Accuracy: backend="triton" on bfloat16 inputs against a float64 reference. At these sizes the step-by-step
reference recurrence (backend="reference") is far too slow, so the reference is backend="torch" (the PyTorch chunk
path) run on float64 CUDA copies of the same inputs (q, k, v rounded to bfloat16 first, so both sides see
the same values and the error measures the kernels, not the rounding of the inputs): in float64 its rounding error (~1e-14) is negligible next to
the bfloat16 tolerances checked here, and the chunk path itself is tested against the step reference on small
shapes in tests/test_core.py. Limits: relative error (Frobenius) <= 1e-2 for o, dq, dk, dv (and the final state,
d initial state) and <= 2e-2 for the log-decay gradients.
Speed: forward and forward+backward timed with triton.testing.do_bench(return_mode="median"); peak memory from
torch.cuda.max_memory_allocated over one forward+backward, minus what was allocated before it.
ULA_CHECK_KINDS=constant,vector restricts the decay kinds. Every case runs in its own try/except: a failure is recorded in the JSON and the table, and the script goes on.
"""
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ula  # noqa: E402
from compare import rel  # noqa: E402

KINDS = tuple(os.environ.get("ULA_CHECK_KINDS", "none,constant,scalar,vector").split(","))  # e.g. =constant
TOL, TOL_DECAY = 1e-2, 2e-2
# (name, B, T, H, K, V, right decay, reverse, varlen lengths or None)
SHAPES = [
    ("B2-T8192-H16-D128", 2, 8192, 16, 128, 128, False, False, None),
    ("B1-T65536-H4-D128", 1, 65536, 4, 128, 128, False, False, None),
    ("odd-B3-T1000-H3-K96-V64", 3, 1000, 3, 96, 64, False, False, None),
    ("odd-B2-T777-H2-K48-V12-right-rev", 2, 777, 2, 48, 12, True, True, None),
    ("odd-B1-T4099-H2-K256-V256", 1, 4099, 2, 256, 256, False, False, None),
    ("varlen-3seq-T10000-H4-K64-V128-right", 1, 10000, 4, 64, 128, True, False, (1234, 7000, 1766)),
]
TIMED = {"B2-T8192-H16-D128", "B1-T65536-H4-D128"}


def log_decay(shape, strength=3.0):
    return F.logsigmoid(torch.randn(shape, device="cuda", dtype=torch.float32) + strength)


def make(kind, right, B, T, H, K, V, N):
    q = torch.randn(B, T, H, K, device="cuda") * 0.5
    k = torch.randn(B, T, H, K, device="cuda") * 0.5
    v = torch.randn(B, T, H, V, device="cuda")
    ld = {"none": None, "constant": log_decay((H,), 2.0), "scalar": log_decay((B, T, H)),
          "vector": log_decay((B, T, H, K))}[kind]
    rd = log_decay((B, T, H, V)) if right else None
    h0 = torch.randn(N, H, K, V, device="cuda") * 0.1
    return q, k, v, ld, rd, h0


def run(backend, inputs, dtype, do, dS, cu, reverse):
    """Forward + backward; returns outputs and gradients, keyed by name."""
    names = ("q", "k", "v", "ld", "rd", "initial_state")
    xs = []
    for i, x in enumerate(inputs):
        if x is None:
            xs.append(None)
            continue
        x = x.detach().to(dtype if i < 3 else (torch.float64 if dtype == torch.float64 else x.dtype))
        xs.append(x.requires_grad_())
    o, S = ula.linear_attention(*xs[:5], initial_state=xs[5], output_final_state=True, cu_seqlens=cu,
                                backend=backend, reverse=reverse)
    loss = (o.double() * do).sum() + (S.double() * dS).sum()
    live = [(n, x) for n, x in zip(names, xs) if x is not None]
    grads = torch.autograd.grad(loss, [x for _, x in live])
    out = {"o": o.detach(), "final_state": S.detach()}
    out.update({"d" + n: g for (n, _), g in zip(live, grads)})
    return out


def accuracy(kind, B, T, H, K, V, right, reverse, lens):
    cu = None
    N = B
    if lens is not None:
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device="cuda", dtype=torch.int32)
        N = len(lens)
    q, k, v, ld, rd, h0 = make(kind, right, B, T, H, K, V, N)
    # both sides get the same values: q, k, v rounded to bfloat16 once (the reference sees them in float64)
    inputs = (q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), ld, rd, h0)
    do = torch.randn(B, T, H, V, device="cuda", dtype=torch.float64)
    dS = torch.randn(N, H, K, V, device="cuda", dtype=torch.float64)
    ours = run("triton", inputs, torch.bfloat16, do, dS, cu, reverse)
    torch.cuda.synchronize()
    ref = run("torch", inputs, torch.float64, do, dS, cu, reverse)
    errs = {n: rel(ours[n], ref[n]) for n in ref}
    del ref
    ok = all(e <= (TOL_DECAY if n in ("dld", "drd") else TOL) for n, e in errs.items())
    return errs, ok


def timing(kind, B, T, H, K, V):
    from triton.testing import do_bench
    q, k, v, ld, rd, _ = make(kind, False, B, T, H, K, V, B)
    q, k, v = (x.bfloat16().requires_grad_() for x in (q, k, v))
    if ld is not None:
        ld.requires_grad_()
    do = torch.randn_like(v)
    leaves = [x for x in (q, k, v, ld) if x is not None]

    def fwd():
        with torch.no_grad():
            return ula.linear_attention(q, k, v, ld, backend="triton")

    def fwd_bwd():
        o, _ = ula.linear_attention(q, k, v, ld, backend="triton")
        return torch.autograd.grad(o, leaves, do)

    fwd_bwd()  # compile
    t_f = do_bench(fwd, return_mode="median")
    t_fb = do_bench(fwd_bwd, return_mode="median")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    return {"fwd_ms": t_f, "fwd_bwd_ms": t_fb, "peak_mib": peak}


def main():
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    import triton
    out_dir = os.environ.get("OUT", "/tmp")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "gpu_check_triton.json")
    report = {"command": "python benchmarks/gpu_check_triton.py", "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
              "tolerances": {"o,dq,dk,dv,state": TOL, "decay grads": TOL_DECAY}, "cases": []}
    torch.manual_seed(0)
    for name, B, T, H, K, V, right, reverse, lens in SHAPES:
        for kind in KINDS:
            case = {"shape": name, "kind": kind, "B": B, "T": T, "H": H, "K": K, "V": V, "right": right,
                    "reverse": reverse, "varlen": lens}
            t0 = time.time()
            try:
                case["errors"], case["ok"] = accuracy(kind, B, T, H, K, V, right, reverse, lens)
            except Exception as e:  # keep going: record the failure
                case["ok"] = False
                case["exception"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            torch.cuda.empty_cache()
            if name in TIMED:
                try:
                    case.update(timing(kind, B, T, H, K, V))
                except Exception as e:
                    case["timing_exception"] = f"{type(e).__name__}: {e}"
                    traceback.print_exc()
                torch.cuda.empty_cache()
            case["seconds"] = time.time() - t0
            report["cases"].append(case)
            errs = case.get("errors", {})
            print(f"{name:40s} {kind:9s} ok={case['ok']} " + " ".join(f"{n}={e:.1e}" for n, e in errs.items())
                  + (f" EXC {case['exception']}" if "exception" in case else ""), flush=True)
            with open(path, "w") as f:  # rewritten after every case: a crash keeps what was measured
                json.dump(report, f, indent=1)
    print(f"\n{report['device']}  torch {report['torch']}  triton {report['triton']}")
    print(f"{'shape':40s} {'kind':9s} {'ok':5s} {'max err':>9s} {'fwd ms':>8s} {'f+b ms':>8s} {'peak MiB':>9s}")
    for c in report["cases"]:
        mx = max(c.get("errors", {"-": float("nan")}).values())
        f = lambda key, fmt: format(c[key], fmt) if key in c else "-"  # noqa: E731
        print(f"{c['shape']:40s} {c['kind']:9s} {str(c['ok']):5s} {mx:9.1e} {f('fwd_ms', '8.3f'):>8s} "
              f"{f('fwd_bwd_ms', '8.3f'):>8s} {f('peak_mib', '9.0f'):>9s}")
    bad = [c for c in report["cases"] if not c["ok"]]
    print(f"\n{len(report['cases']) - len(bad)}/{len(report['cases'])} cases within tolerance; JSON: {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
