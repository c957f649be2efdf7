"""Why the core's backward costs the host ~370 µs more through its custom op than called directly (session 36,
benchmarks/gpu_compile_host.py; the forward: +24 µs). Times the call, the time inside the wrapped function, and
cProfile's top functions (own time) each way, with the GPU held busy.
Run: PYTHONPATH=. python3 benchmarks/gpu_custom_op_cost.py"""
import cProfile
import pstats
import time

import torch

from ula.core import op

B, T, H, K, V = 2, 8192, 16, 128, 128
q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for D in (K, K, V, V))
fargs = (q, k, v, None, None, None, None, K ** -0.5, False, 64, "auto", None, "")
bargs = fargs[:6] + (q.new_empty(0), do, None) + fargs[6:11] + (False, False, None, "")
inner = []
orig = op._backward_impl


def timed(*a):
    t0 = time.perf_counter()
    r = orig(*a)
    inner.append((time.perf_counter() - t0) * 1e6)
    return r


op._backward_impl = timed
rows = {"direct": lambda: op._backward_impl(*bargs), "custom op": lambda: op.linear_attention_bwd(*bargs),
        "forward direct": lambda: op._forward(*fargs), "forward custom op": lambda: op.linear_attention_fwd(*fargs)}
for name, fn in rows.items():
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(1e9))
    inner.clear()
    ts = []
    for _ in range(30):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    med = sorted(ts)[15]
    inside = sorted(inner)[len(inner) // 2] if inner else float("nan")
    print(f"{name}: call {med:.0f} us, inside _backward_impl {inside:.0f} us", flush=True)
    pr = cProfile.Profile()
    torch.cuda._sleep(int(1e9))
    pr.enable()
    for _ in range(10):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(pr)
    for (fname, line, func), (cc, nc, tt, ct, _) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:12]:
        print(f"   {tt / 10 * 1e6:8.1f} own {ct / 10 * 1e6:8.1f} cum x{nc // 10:<4d} {fname.split('/')[-1]}:{line}({func})")
