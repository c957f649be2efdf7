"""bf16 error of the Triton kernels against float64, studied on a CPU: the interpreter with ULA_EMULATE_BF16=1
rounds every matmul operand to bfloat16 as a GPU's dot would (ula/core/triton/utils.py), with float32 inputs and
outputs, so what it measures is the kernels' own rounding (a GPU adds the rounding of bf16 inputs and outputs,
~2.3e-3 relative for an output).

    ULA_EMULATE_BF16=1 TRITON_INTERPRET=1 python3 benchmarks/cpu_bf16_error.py [--op gla] [--shape 1,256,2,64,64]

Prints the relative error of the output and of every gradient."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="gla", choices=["gla", "scalar", "none"])
    ap.add_argument("--shape", default="1,256,2,64,64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--gpu-inputs", action="store_true",
                    help="the GPU quality test's inputs (ula/bench/families.make: q scaled K^-0.5, gates logsigmoid(x + 4))")
    a = ap.parse_args()
    B, T, H, K, V = (int(x) for x in a.shape.split(","))
    torch.manual_seed(a.seed)
    rb = lambda x: x.bfloat16().float()  # noqa: E731  (inputs as a bf16 model would hold them)
    q, k, v = rb(torch.randn(B, T, H, K)), rb(torch.randn(B, T, H, K) * K ** -0.5), rb(torch.randn(B, T, H, V))
    g = {"gla": F.logsigmoid(torch.randn(B, T, H, K) + 3) / 16, "scalar": F.logsigmoid(torch.randn(B, T, H) + 3),
         "none": None}[a.op]
    if a.gpu_inputs:
        q = rb(q * K ** -0.5)
        g = {"gla": F.logsigmoid(torch.randn(B, T, H, K) + 4), "scalar": F.logsigmoid(torch.randn(B, T, H) + 4),
             "none": None}[a.op]
    do = torch.randn(B, T, H, V)

    def run(backend, dt):
        xs = [t.to(dt).clone().requires_grad_() for t in (q, k, v) + ((g,) if g is not None else ())]
        if a.op == "gla":
            o, _ = ula.gla(*xs, backend=backend, chunk_size=a.chunk)
        else:
            o, _ = ula.linear_attention(*xs, backend=backend)
        (o.double() * do.double()).sum().backward()
        return [o] + [x.grad for x in xs]

    ref, got = run("torch", torch.float64), run("triton", torch.float32)
    names = ["o", "dq", "dk", "dv"] + (["dg"] if g is not None else [])
    print(f"ULA_EMULATE_BF16={os.environ.get('ULA_EMULATE_BF16')} {a.op} B{B} T{T} H{H} K{K} V{V}: " +
          " ".join(f"{n} {((x.double() - y).norm() / y.norm()).item():.2e}" for n, x, y in zip(names, got, ref)))


if __name__ == "__main__":
    main()
