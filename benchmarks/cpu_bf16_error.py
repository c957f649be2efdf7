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
reproduces the H100's GSA errors within ~3% (benchmarks/results/bf16_error_study_gsa_cpu.txt). --split-dg and
--variant run `gsa_study`: gsa.py as it was before that study (p rounded to bf16 before pass 2) with switches.
--seeds N: N seeds from --seed on, one line each, then the per-tensor medians."""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402


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


def gsa_study(q, k, v, s, g1, g2, a):
    """ula.gsa (ula/ops/gsa.py) spelled out, with the study's switches (--variant, comma-separated):
    o1f32: pass 1's output o1 kept float32 up to the softmax (pass 1 gets s as float32 for its v: the matmul
           operands stay bf16, its outputs, o1, and the gradient reaching it, d o1, float32);
    pf32:  the softmax output p enters pass 2 in float32 (its dots still round it to bf16; the gradient dp comes
           out float32 and the decay gradient's q ⊙ dq term reads exact p);
    s2f32: s enters pass 2 (as its k) in float32: that pass's ds comes out float32 (with o1f32 too, the two
           gradients of s are summed in float32 and rounded to bf16 once, as fla does);
    c64p1, c64p2: chunk 64 for pass 1 or pass 2 alone (the other keeps the chunk of --chunk-gsa / gsa's choice).
    g1, g2: the log gate of pass 1 (right decay) and of pass 2 (left decay), separate leaves with --split-dg."""
    var = set(filter(None, a.variant.split(",")))
    chunk = a.chunk_gsa if a.chunk_gsa is not None else (128 if s.shape[-1] <= 64 else None)
    from ula.core.op import run  # the core call without its checks (which want one dtype for q, k, v)
    backend = a.backend_now
    if chunk is None:
        chunk = 64

    def core(q, k, v, ld, rd, scale, c=chunk):
        return run(q, k, v, ld, rd, None, None, scale, False, c, backend)[0]

    s_ = s.to(q.dtype)
    s32 = s_.float() if q.dtype != torch.float64 else s_  # one float32 copy: its two gradients summed in float32
    v1 = s32 if "o1f32" in var else s_
    o1 = core(q, k, v1, None, g1, q.shape[-1] ** -0.5, 64 if "c64p1" in var else chunk)
    p = torch.softmax(o1.to(g1.dtype), -1)
    p = p if "pf32" in var else p.to(q.dtype)
    return core(p, s32 if "s2f32" in var else s_, v, g2, None, 1.0, 64 if "c64p2" in var else chunk)


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
        if a.op == "gsa" and a.split_dg:  # one leaf for each pass's gate
            xs.append(xs[-1].detach().clone().requires_grad_())
        if a.op == "gla":
            o, _ = ula.gla(*xs, backend=backend, chunk_size=a.chunk)
        elif a.op == "gsa" and (a.variant or a.split_dg):
            a.backend_now = backend
            o = gsa_study(*xs, *([] if a.split_dg else xs[-1:]), a)
        elif a.op == "gsa":
            o, _ = ula.gsa(*xs, backend=backend, chunk_size=a.chunk_gsa)
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
    if a.op == "gsa" and a.split_dg:  # dg1: pass 1's (right decay), dg2: pass 2's (left decay), dg: their sum
        names = names[:-1] + ["dg1", "dg2", "dg"]
        got, ref = got + [got[-2] + got[-1]], ref + [ref[-2] + ref[-1]]
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
    ap.add_argument("--variant", default="", help="gsa: study switches, comma-separated (see gsa_study)")
    ap.add_argument("--split-dg", action="store_true", help="gsa: dg of each pass apart (dg1, dg2) and summed")
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
