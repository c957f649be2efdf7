"""Where the host's time goes when the core runs compiled (session 35: compiled normalized attention and GLA took
1.19-1.23x eager's wall time at the same GPU time; session 36: host submit +0.7-1.4 ms per forward+backward).

Each line is the median host time (µs) of one call with the GPU held busy (a spin kernel queued first, so no launch
waits), B2 T8192 H16 K=V=128 bf16 unless --shape:
- forward direct: op._forward (the functions inside both wrappers), no autograd;
- forward custom op: the same through torch.ops.ula.linear_attention_fwd (the dispatcher, torch.library's layers);
- backward direct / custom op: the same for the backward functions;
- f+b eager: ula.linear_attention + backward (autograd.Function);
- f+b compiled: torch.compile(fullgraph=True) of the same;
- f+b compiled trivial: torch.compile of q * k + v with the same leaves (torch.compile's own cost per call);
then torch.profiler's CPU table of the compiled f+b (self CPU time).
Run: PYTHONPATH=. python3 benchmarks/gpu_compile_host.py [--shape B,T,H,K,V]"""
import argparse

import torch
import triton

import ula
from gpu_host_families import host_ms
from ula.core import op


def host_us(fn):
    """Median host time of fn() in µs with the GPU busy (gpu_host_families.host_ms), after 3 warm-up calls."""
    for _ in range(3):
        fn()
    return host_ms(fn)[0] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,8192,16,128,128")
    a = ap.parse_args()
    B, T, H, K, V = (int(x) for x in a.shape.split(","))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, "shape", a.shape)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for D in (K, K, V))
    do = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
    fargs = (q.detach(), k.detach(), v.detach(), None, None, None, None, K ** -0.5, False, 64, "auto", None, "")
    out = op._forward(*fargs)[0]
    bargs = fargs[:6] + (op.o_for_grad(out, out.new_empty(0), None), do, None) + fargs[6:11] + (False, False, None,
                                                                                                 "")
    rows = {"forward direct": lambda: op._forward(*fargs),
            "forward custom op": lambda: op.linear_attention_fwd(*fargs),
            "backward direct": lambda: op._backward_impl(*bargs),
            "backward custom op": lambda: op.linear_attention_bwd(*bargs)}

    def fb(fn, *x):
        def run():
            for t in x:
                t.grad = None
            fn(*x).backward(do)
        return run

    lin = lambda q, k, v: ula.linear_attention(q, k, v)[0]  # noqa: E731
    rows["f+b eager"] = fb(lin, q, k, v)
    rows["f+b compiled"] = fb(torch.compile(lin, fullgraph=True), q, k, v)  # (its own wrapper: no recompiles)
    rows["f+b compiled trivial"] = fb(torch.compile(lambda q, k, v: q * k + v, fullgraph=True), q, k, v)
    lin_c = torch.compile(lin, fullgraph=True)
    rows["forward compiled, no grad"] = lambda: lin_c(q, k, v)
    for name, fn in rows.items():
        if "no grad" in name:
            with torch.no_grad():
                us = host_us(fn)
        else:
            us = host_us(fn)
        print(f"{name}: {us:.0f} us", flush=True)
    from torch.profiler import ProfilerActivity, profile
    run = rows["f+b compiled"]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            run()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70))


if __name__ == "__main__":
    main()
