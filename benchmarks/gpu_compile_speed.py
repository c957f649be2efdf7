"""Forward+backward time of an op eager and under torch.compile(fullgraph=True), same inputs, same GPU, one process:
whether a trace runs as fast as eager (since session 34 mLSTMexp and normalized attention take their Triton kernels
in a trace too; before, their PyTorch forms). B2 T8192 H16 K=V=128 bf16, median of 30 timed calls (CUDA events)
after 5 warm-up calls. Run: PYTHONPATH=. python3 benchmarks/gpu_compile_speed.py [op,op...]"""
import statistics
import sys

import torch

import ula

dev, B, T, H, D = "cuda", 2, 8192, 16, 128
torch.manual_seed(0)
q, k, v = (torch.randn(B, T, H, D, device=dev).bfloat16().requires_grad_() for _ in range(3))
i, f = (torch.randn(B, T, H, device=dev).requires_grad_() for _ in range(2))
do = torch.randn(B, T, H, D, device=dev).bfloat16()
OPS_ALL = {"mlstm exp": lambda: ula.mlstm(q, k, v, i, f + 3)[0],
       "normalized": lambda: ula.normalized_linear_attention(q, k, v)[0],
       "gla": lambda: ula.gla(q, k, v, torch.nn.functional.logsigmoid(f + 3).unsqueeze(-1).expand(B, T, H, D))[0]}


OPS = {n: OPS_ALL[n] for n in (sys.argv[1].split(",") if len(sys.argv) > 1 else OPS_ALL)}


def median_ms(fn):
    times = []
    for n in range(35):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn().backward(do)
        end.record()
        torch.cuda.synchronize()
        if n >= 5:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


print(torch.__version__, torch.cuda.get_device_name(), flush=True)
for name, fn in OPS.items():
    torch._dynamo.reset()
    eager = median_ms(fn)
    compiled = median_ms(torch.compile(fn, fullgraph=True))
    print(f"{name}: eager {eager:.3f} ms, compiled {compiled:.3f} ms, compiled / eager {compiled / eager:.2f}",
          flush=True)
