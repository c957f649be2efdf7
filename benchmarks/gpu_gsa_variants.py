"""GSA's precision choices timed and measured in one run (issue 8 item 6: bf16 error no worse than fla's, without
losing GSA's time bar): forward+backward time (eager do_bench and CUDA-graph replays) at B2 T8192 H16 K=V=128 m=64
and the bf16 error of o and every gradient against float64 at the quality test's B2 T2048 (inputs and output
gradient as benchmarks/gpu_hardening.py's quality test, so fla's numbers there compare: session 11, H100, o 3.19e-3,
dq 2.89, dk 2.96, dv 2.85, ds 2.73, dg 2.97).

    python3 benchmarks/gpu_gsa_variants.py [--variants default,fast,accurate,p_bf16,c128p2,accurate+c128p2]

Variants: default (ula.gsa as it is: gsa.PASS_PRECISION, the float32 handovers); fast, accurate (ula.set_precision's
presets for every matmul, ula/core/precision.py); p_bf16 (the softmax output rounded to bf16 before pass 2, as before
session 12); o1_bf16 (pass 1's output and its gradient rounded to bf16 between the passes, s in bf16: before session
14); s_wide (s in float32 for both passes, its two gradients summed before one rounding: session 14's default); c128p2
(chunk 128 for pass 2 too where m <= 64, as before session 15); p1acc, p2acc ("accurate" for pass 1 or pass 2 only,
the other at GSA's default); p2own (pass 2 at own_block alone: session 13's default, which was o1_bf16+p2own);
p2=part.part (pass 2 at those precision parts, ula/core/precision.py); '+' combines them. One JSON line per variant."""
import argparse
import importlib
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402
from ula.bench import families as fam  # noqa: E402
from ula.bench.measure import graph_times, measure  # noqa: E402
from ula.core.api import linear_attention  # noqa: E402
from gpu_hardening import fwd_bwd, rel  # noqa: E402  (this folder: the quality test's forms)

gsa_mod = importlib.import_module("ula.ops.gsa")
_second_pass = gsa_mod._second_pass


def _p_bf16(p, s, v, g, h2, dtype, kw):
    return linear_attention(p.to(dtype), s.to(dtype), v, g, None, scale=1.0, initial_state=h2, **kw)


_PASS_PRECISION = gsa_mod.PASS_PRECISION
_SMALL_M_CHUNKS, _WIDE_S = gsa_mod.SMALL_M_CHUNKS, gsa_mod.WIDE_S
_first_pass = gsa_mod._first_pass


def _o1_bf16(q, k, s, g, h1, scale, kw):
    return linear_attention(q, k, s.to(q.dtype), None, g, scale=scale, initial_state=h1, **kw)


def apply(variant):
    """Set gsa.py's switches for one variant ('+'-joined parts, see the module docstring); "default" restores them."""
    parts = set(variant.split("+"))
    gsa_mod._first_pass = _o1_bf16 if "o1_bf16" in parts else _first_pass
    gsa_mod.WIDE_S = ("s_wide" in parts or _WIDE_S) and "o1_bf16" not in parts
    gsa_mod._second_pass = _p_bf16 if "p_bf16" in parts else _second_pass
    gsa_mod.SMALL_M_CHUNKS = (128, 128) if "c128p2" in parts else _SMALL_M_CHUNKS
    p1, p2 = _PASS_PRECISION
    p1 = "accurate" if "p1acc" in parts else ("own_block",) if "p1own" in parts else p1
    p2 = "accurate" if "p2acc" in parts else ("own_block",) if "p2own" in parts else p2
    for part in parts:  # p2=part.part...: pass 2 at those precision parts
        if part.startswith("p2="):
            p2 = tuple(part[3:].split("."))
    gsa_mod.PASS_PRECISION = (p1, p2)
    ula.set_precision("fast" if "fast" in parts else "accurate" if "accurate" in parts else None)


def errors(B, T, H, K, V, dev="cuda"):
    """bf16 error of o and every gradient against float64, as gpu_hardening.py's quality test measures it."""
    x = fam.make("gsa", B, T, H, K, V, dev, torch.bfloat16)
    torch.manual_seed(4)
    do = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
    ref = fwd_bwd(fam.ours("gsa", backend="torch"), x, do, dtype=torch.float64)
    got = fwd_bwd(fam.ours("gsa", backend="auto" if dev == "cuda" else "triton"), x, do)
    return {n: round(rel(got[n], r), 6) for n, r in ref.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="default,fast,accurate,p_bf16,c128p2")
    ap.add_argument("--shape", default="2,8192,16,128,128")
    ap.add_argument("--q-shape", default="2,2048,16,128,128")
    ap.add_argument("--cpu-smoke", action="store_true", help="errors only, on the CPU (Triton's interpreter)")
    a = ap.parse_args()
    if a.cpu_smoke:
        for variant in a.variants.split(","):
            apply(variant)
            print(variant, errors(*(int(v) for v in a.q_shape.split(",")), dev="cpu"))
        apply("default")
        return
    shape = tuple(int(v) for v in a.shape.split(","))
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                          shape=shape, q_shape=a.q_shape)), flush=True)
    for variant in a.variants.split(","):
        apply(variant)
        fn, args = fam.as_args(fam.ours("gsa"), fam.make("gsa", *shape, "cuda", torch.bfloat16))
        t_f, t_fb, mem = measure(fn, args)
        g_f, g_fb = graph_times(fn, args)
        del fn, args
        torch.cuda.empty_cache()
        err = errors(*(int(v) for v in a.q_shape.split(",")))
        print(json.dumps(dict(variant=variant, fwd_ms=round(t_f, 4), fwdbwd_ms=round(t_fb, 4), peak_mib=round(mem, 1),
                              fwd_graph_ms=round(g_f, 4), fwdbwd_graph_ms=round(g_fb, 4), errors=err)), flush=True)
    apply("default")


if __name__ == "__main__":
    main()
