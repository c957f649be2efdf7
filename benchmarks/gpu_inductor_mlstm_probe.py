"""mLSTMexp forward+backward through torch.compile(fullgraph=True) with Inductor on the GPU: prints "ok" or the part
of the error that names the failing compiler step (session 33: with the column-of-ones kernels as custom ops, the
patch results/session33_ones_custom_op_trial.patch, Triton's make_ttgir failed on an Inductor kernel).
Run: PYTHONPATH=. python3 benchmarks/gpu_inductor_mlstm_probe.py"""
import torch

import ula

T, H, K = 256, 2, 32
q, k, v = (torch.randn(1, T, H, K, device="cuda").bfloat16().requires_grad_() for _ in range(3))
i, f = (torch.randn(1, T, H, device="cuda").requires_grad_() for _ in range(2))
def model(q, k, v, i, f):
    return ula.mlstm(q, k, v, i, f + 3)[0].float().square().mean()
try:
    torch.compile(model, fullgraph=True)(q, k, v, i, f).backward()
    print("ok")
except Exception as e:
    s = " ".join(str(e).split())
    for key in ("error:", "Error", "failed", "unsupported", "fp64", "f64"):
        j = s.find(key)
        if j >= 0:
            print(key, "::", s[max(0, j - 600): j + 400])
            break
    print("TAIL", s[-1500:])
