"""Forward+backward time of an op eager and under torch.compile(fullgraph=True), same inputs, same GPU, one process:
whether a trace runs as fast as eager (since session 34 mLSTMexp and normalized attention take their Triton kernels
in a trace too; before, their PyTorch forms). B2 T8192 H16 K=V=128 bf16. Two measures each: the wall time of a
call (median of 30 after 5 warm-up calls, CUDA events: host-bound, noisy) and the median of CUDA-graph replays of
a forward+backward (`ula.bench.measure.graph_times`: the GPU's time alone, METHOD.md).
GSA and ABC (m = 64 slots) only when named. Run: PYTHONPATH=. python3 benchmarks/gpu_compile_speed.py [op,op...]"""
import statistics
import sys

import torch
import torch.nn.functional as F

import ula
from ula.bench.measure import graph_times

dev, B, T, H, D = "cuda", 2, 8192, 16, 128
torch.manual_seed(0)
q, k, v = (torch.randn(B, T, H, D, device=dev).bfloat16().requires_grad_() for _ in range(3))
i, f = (torch.randn(B, T, H, device=dev).requires_grad_() for _ in range(2))
gk = F.logsigmoid(torch.randn(B, T, H, D, device=dev) + 3).requires_grad_()
s = torch.randn(B, T, H, 64, device=dev).bfloat16().requires_grad_()
gs = F.logsigmoid(torch.randn(B, T, H, 64, device=dev) + 3).requires_grad_()
ARGS = {"mlstm exp": (q, k, v, i, f), "normalized": (q, k, v), "gla": (q, k, v, gk), "gsa": (q, k, v, s, gs),
        "abc": (q, k, v, s)}
OPS_ALL = {"mlstm exp": lambda q, k, v, i, f: ula.mlstm(q, k, v, i, f + 3)[0],
           "normalized": lambda q, k, v: ula.normalized_linear_attention(q, k, v)[0],
           "gla": lambda q, k, v, g: ula.gla(q, k, v, g)[0],
           "gsa": lambda q, k, v, s, g: ula.gsa(q, k, v, s, g)[0],  # m = 64
           "abc": lambda q, k, v, w: ula.abc(q, k, v, w)[0]}
OPS = {n: OPS_ALL[n] for n in (sys.argv[1].split(",") if len(sys.argv) > 1 else list(OPS_ALL)[:3])}


def wall_ms(fn, args):
    do = torch.randn_like(fn(*args))
    times = []
    for n in range(35):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args).backward(do)
        end.record()
        torch.cuda.synchronize()
        if n >= 5:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


print(torch.__version__, torch.cuda.get_device_name(), flush=True)
for name, fn in OPS.items():
    args = ARGS[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    row = {}
    for label, g in (("eager", fn), ("compiled", compiled)):
        row[label] = (wall_ms(g, args), graph_times(g, args)[1])
    (we, ge), (wc, gc) = row["eager"], row["compiled"]
    print(f"{name}: wall eager {we:.3f} compiled {wc:.3f} ms ({wc / we:.2f}); graph replays eager {ge:.3f} "
          f"compiled {gc:.3f} ms ({gc / ge:.2f})", flush=True)
