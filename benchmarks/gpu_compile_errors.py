"""Where torch.compile(fullgraph=True) and eager differ on the GPU (benchmarks/gpu_compile_checks.py: mLSTMexp
3.7e-1, normalized 3.0e-2, GSA 7.3e-3 in bf16): each against the float64 PyTorch path on the same inputs, per tensor.
Run: PYTHONPATH=. python3 benchmarks/gpu_compile_errors.py"""
import torch
import torch.nn.functional as F

import ula

dev = "cuda"
T, H, K = 256, 2, 32
torch.manual_seed(0)
base = [torch.randn(1, T, H, K, device=dev).bfloat16().double() for _ in range(3)]
gates = [torch.randn(1, T, H, device=dev).double() for _ in range(2)]
slots = torch.randn(1, T, H, 8, device=dev).double()


def call(name, q, k, v, i, f, s, backend):
    if name == "mlstm exp":
        return ula.mlstm(q, k, v, i, f + 3, backend=backend)[0]
    if name == "normalized":
        return ula.normalized_linear_attention(q, k, v, backend=backend)[0]
    return ula.gsa(q, k, v, s, F.logsigmoid(s + 3), backend=backend)[0]


def grads(name, dt, gdt, compiled=False, backend="auto"):
    q, k, v = (x.detach().to(dt).clone().requires_grad_() for x in base)
    i, f = (x.detach().to(gdt).clone().requires_grad_() for x in gates)
    s = slots.detach().to(gdt).clone().requires_grad_()
    fn = lambda *a: call(name, *a, backend)  # noqa: E731
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True)
    out = fn(q, k, v, i, f, s)
    (out.double() * w[name]).sum().backward()
    names = ["out", "dq", "dk", "dv"] + {"mlstm exp": ["di", "df"], "normalized": [], "gsa": ["ds"]}[name]
    ts = [out, q.grad, k.grad, v.grad] + {"mlstm exp": [i.grad, f.grad], "normalized": [], "gsa": [s.grad]}[name]
    return dict(zip(names, [t.detach().double() for t in ts]))


w = {}
print(torch.__version__, torch.cuda.get_device_name())
for name in ("mlstm exp", "normalized", "gsa"):
    w[name] = torch.randn(1, T, H, K, device=dev).double()
    ref = grads(name, torch.float64, torch.float64, backend="torch")
    eager = grads(name, torch.bfloat16, torch.float32)
    try:
        comp = grads(name, torch.bfloat16, torch.float32, compiled=True)
    except Exception as e:
        comp = None
        print(name, "compiled FAILS", type(e).__name__, " ".join(str(e).split())[:300])
    for t in ref:
        r = ref[t]
        err = lambda x: ((x - r).norm() / r.norm()).item()  # noqa: E731
        print(f"{name} {t}: eager {err(eager[t]):.1e}" + (f" compiled {err(comp[t]):.1e}" if comp else ""), flush=True)
