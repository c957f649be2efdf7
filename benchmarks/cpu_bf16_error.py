"""bf16 error of the Triton kernels against float64, studied on a CPU: the interpreter with ULA_EMULATE_BF16=1
rounds every matmul operand to bfloat16 as a GPU's dot would (ula/core/triton/utils.py), with float32 inputs and
outputs, so what it measures is the kernels' own rounding (a GPU adds the rounding of bf16 inputs and outputs,
~2.3e-3 relative for an output).

    ULA_EMULATE_BF16=1 TRITON_INTERPRET=1 python3 benchmarks/cpu_bf16_error.py [--op gla] [--shape 1,256,2,64,64]

Prints the relative error of the output and of every gradient.

--op gsa: Gated Slot Attention (ula.gsa) on inputs like ula/bench/families.make's ("gsa": q, k scaled K^-0.5,
v normal, s = randn, g = logsigmoid(randn + 4) of --m slots; held at bf16 values). --bf16: the inputs as bfloat16
tensors (g float32), as on a GPU: then the kernels' outputs and what gsa.py passes between its two core calls are
rounded to bf16 as there (the interpreter still computes the dots in float32, operands rounded to bf16); this
reproduces the H100's GSA errors within ~3% (benchmarks/results/bf16_error_study_gsa_cpu.txt).
--variant (gsa): one variant of benchmarks/gpu_gsa_variants.py (its switches, so the CPU and the GPU study the same
thing); the session-12 study's `gsa_study` (gsa.py of that time spelled out) is gone with that code.
ULA_TF32_TRUNC=1 makes the emulated tf32 parts truncate as the H100 does (ula/core/triton/utils.py).
--seeds N: N seeds from --seed on, one line each, then the per-tensor medians."""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402
import gpu_gsa_variants as gsa_variants  # noqa: E402  (this folder)


def _rtne_bf16_stores():
    """The Triton 3.6 interpreter converts float32 to bfloat16 by truncation (`.to(tl.bfloat16)` and stores into
    bfloat16 tensors: twice the rounding error of a GPU's round-to-nearest-even). Under the interpreter, make that
    conversion round to nearest even (through torch), so that --bf16 outputs are rounded as on a GPU."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    orig = interpreter._convert_float

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            x = torch.from_numpy(np.ascontiguousarray(input).view(np.float32))
            return x.bfloat16().view(torch.int16).numpy().view(np.uint16)
        return orig(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert


def rb(x):
    """x at bfloat16 values, in float32 (inputs as a bf16 model would hold them)."""
    return x.bfloat16().float()


def inputs(a, B, T, H, K, V):
    q, k, v = rb(torch.randn(B, T, H, K)), rb(torch.randn(B, T, H, K) * K ** -0.5), rb(torch.randn(B, T, H, V))
    if a.op == "gsa":  # families.make("gsa"): q, k scaled K^-0.5, s = randn, g = logsigmoid(x + 4) (float32)
        q = rb(q * K ** -0.5)
        s, g = rb(torch.randn(B, T, H, a.m)), F.logsigmoid(torch.randn(B, T, H, a.m) + 4)
        return [q, k, v, s, g], ["o", "dq", "dk", "dv", "ds", "dg"]
    const = ula.retnet_log_decay(H, "cpu")  # the GPU quality test's constant decay (families.make)
    g = {"gla": F.logsigmoid(torch.randn(B, T, H, K) + 3) / 16, "scalar": F.logsigmoid(torch.randn(B, T, H) + 3),
         "constant": const, "none": None}[a.op]
    if a.gpu_inputs:
        q = rb(q * K ** -0.5)
        g = {"gla": F.logsigmoid(torch.randn(B, T, H, K) + 4), "scalar": F.logsigmoid(torch.randn(B, T, H) + 4),
             "constant": const, "none": None}[a.op]
    return [q, k, v] + ([g] if g is not None else []), ["o", "dq", "dk", "dv"] + (["dg"] if g is not None else [])


def one(a, seed):
    B, T, H, K, V = (int(x) for x in a.shape.split(","))
    torch.manual_seed(seed)
    xs0, names = inputs(a, B, T, H, K, V)
    do = torch.randn(B, T, H, V)
    if a.bf16:
        do = rb(do)

    def run(backend, dt):
        xs = []
        for i, t in enumerate(xs0):
            # log gates and decays stay float32
            keep32 = i == len(xs0) - 1 and ((t.dim() == 4 and a.op in ("gla", "gsa")) or a.op in ("constant", "scalar"))
            xs.append(t.to(torch.float32 if (keep32 and dt == torch.bfloat16) else dt).clone().requires_grad_())
        if a.op == "gla":
            o, _ = ula.gla(*xs, backend=backend, chunk_size=a.chunk)
        elif a.op == "gsa":
            if backend == "triton" and a.variant:  # the reference runs gsa as it is
                gsa_variants.apply(a.variant)
            o, _ = ula.gsa(*xs, backend=backend, chunk_size=a.chunk_gsa)
            gsa_variants.apply("default")
        else:
            o, _ = ula.linear_attention(*xs, backend=backend)
        (o.double() * do.double()).sum().backward()
        return [o] + [x.grad for x in xs]

    ref = run("torch", torch.float64)
    cap = {}
    if a.dg_parts:  # the Triton backward's decay gradient, from its per-step terms alone and from its border terms
        from ula.core.triton import backward as bw
        orig = bw.decay_grad_from_terms

        def parts(db, X, *args, **kw):
            cap["dg_step"] = orig(db, torch.zeros_like(X), *args, **kw)
            cap["dg_X"] = orig(torch.zeros_like(db), X, *args, **kw)
            return orig(db, X, *args, **kw)
        bw.decay_grad_from_terms = parts
    got = run("triton", torch.bfloat16 if a.bf16 else torch.float32)
    if a.dg_parts:
        bw.decay_grad_from_terms = orig
        # float64 reference of the parts: per-step terms q ⊙ dq − k ⊙ dk summed from each step to its chunk's end
        # (forward direction), the border terms the rest of dg
        q, k = xs0[0].double(), xs0[1].double()
        t = q * ref[1] - k * ref[2]
        tc = t.reshape(B, T // a.chunk, a.chunk, H, K)
        step = (tc.flip(2).cumsum(2).flip(2)).reshape(B, T, H, K)
        dg_ref = ref[4]
        out = {n: ((x.double() - y).norm() / y.norm()).item() for n, x, y in zip(names, got, ref)}
        for n, x, y in (("dg_step", cap["dg_step"], step), ("dg_X", cap["dg_X"], dg_ref - step)):
            out[n] = ((x.double() - y).norm() / dg_ref.norm()).item()  # relative to dg's norm
        return out
    return {n: ((x.double() - y).norm() / y.norm()).item() for n, x, y in zip(names, got, ref)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="gla", choices=["gla", "scalar", "constant", "none", "gsa"])
    ap.add_argument("--shape", default="1,256,2,64,64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--chunk-gsa", type=int, default=None, help="gsa's chunk_size (None: gsa's own choice)")
    ap.add_argument("--m", type=int, default=64, help="gsa: memory slots")
    ap.add_argument("--variant", default="",
                    help="gsa: a variant of gpu_gsa_variants.py (e.g. p2=own_block.states_backward)")
    ap.add_argument("--dg-parts", action="store_true",
                    help="gla: dg's error from its per-step terms (dg_step) and border terms (dg_X), each over |dg|")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 input tensors (rounded outputs, see above)")
    ap.add_argument("--gpu-inputs", action="store_true",
                    help="the GPU quality test's inputs (ula/bench/families.make: q scaled K^-0.5, gates logsigmoid(x + 4))")
    a = ap.parse_args()
    if a.bf16:
        _rtne_bf16_stores()
    B, T, H, K, V = (int(x) for x in a.shape.split(","))
    head = (f"ULA_EMULATE_BF16={os.environ.get('ULA_EMULATE_BF16')} {a.op} B{B} T{T} H{H} K{K} V{V}"
            + (f" m{a.m}" if a.op == "gsa" else "") + (" bf16-inputs" if a.bf16 else ""))
    runs = []
    for seed in range(a.seed, a.seed + a.seeds):
        e = one(a, seed)
        runs.append(e)
        tag = f" seed {seed}" if a.seeds > 1 else ""
        print(head + tag + ": " + " ".join(f"{n} {x:.2e}" for n, x in e.items()), flush=True)
    if a.seeds > 1:
        print(head + f" median of {a.seeds}: " +
              " ".join(f"{n} {statistics.median(r[n] for r in runs):.2e}" for n in runs[0]))


if __name__ == "__main__":
    main()
