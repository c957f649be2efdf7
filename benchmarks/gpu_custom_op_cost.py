"""Why the core's backward costs the host ~370 µs more through its custom op than called directly (session 36,
benchmarks/gpu_compile_host.py; the forward: +24 µs). Times the call, the time inside the wrapped function, and
cProfile's top functions (own time) each way, with the GPU held busy.
Run: PYTHONPATH=. python3 benchmarks/gpu_custom_op_cost.py"""
import statistics
import time

import torch

from gpu_compile_host import host_us
from gpu_profile import host_top
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
    inner.clear()
    med = host_us(fn)
    inside = statistics.median(inner) if inner else float("nan")
    print(f"{name}: call {med:.0f} us, inside _backward_impl {inside:.0f} us", flush=True)
    for line in host_top(fn, iters=10, k=12)[1]:
        print("   " + line)
