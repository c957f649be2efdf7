"""Why compiled ABC's GPU time is 2.08x eager's (session 36: B2 T8192 H16 m=64 f+b, graph replays 15.9 against
7.6 ms; GSA 0.98x): torch.profiler's CUDA kernels of one f+b, eager and compiled (default mode), top by GPU time.
Run: PYTHONPATH=. python3 benchmarks/gpu_abc_compiled_profile.py"""
import torch
from torch.profiler import ProfilerActivity, profile

import ula

B, T, H, D, M = 2, 8192, 16, 128, 64
torch.manual_seed(0)
q, k, v = (torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_() for _ in range(3))
w = torch.randn(B, T, H, M, device="cuda").bfloat16().requires_grad_()
fn = lambda q, k, v, w: ula.abc(q, k, v, w)[0]  # noqa: E731
do = torch.randn(B, T, H, D, device="cuda").bfloat16()
for name, f in (("eager", fn), ("compiled", torch.compile(fn, fullgraph=True))):
    for _ in range(3):
        f(q, k, v, w).backward(do)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            f(q, k, v, w).backward(do)
        torch.cuda.synchronize()
    print(f"### {name} (5 f+b)")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=90))
