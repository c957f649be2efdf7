"""The state kernel's three calls of one forward+backward and the output kernel's forward, dQ and dK calls, timed
one by one, with and without the column of ones (mLSTMsig against mLSTMexp's configuration: scalar decay, key
gate, B2 T8192 H16 K=V=128 bf16 by default). Which of the calls carries exp's extra time? With the column, also the
backward's second state call as the backward makes it (the column's borders given by the forward's call); the sums
below are of the calls as first made.

    python3 benchmarks/gpu_state_calls.py [--shape 2,8192,16,128,128] [--chunk 128]

Prints one line per call: median ms (triton.testing.do_bench) without and with the column of ones."""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.core.triton.chunk import make_layout  # noqa: E402
from ula.core.triton.cumsum import chunk_cumsum  # noqa: E402
from ula.core.triton.output import chunk_output  # noqa: E402
from ula.core.triton.state import chunk_states  # noqa: E402
from ula.core.triton.utils import dot_code  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2,8192,16,128,128")
    ap.add_argument("--chunk", type=int, default=128)
    a = ap.parse_args()
    B, T, H, K, V = (int(x) for x in a.shape.split(","))
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    q, k, do = (torch.randn(B, T, H, K, device=dev, dtype=bf) for _ in range(3))
    v = torch.randn(B, T, H, V, device=dev, dtype=bf)
    ld = F.logsigmoid(torch.randn(B, T, H, device=dev) + 3)
    u = F.logsigmoid(torch.randn(B, T, H, device=dev))
    e = torch.randn(B, T, H, device=dev)
    layout = make_layout(B, T, a.chunk, None, dev)
    gl = ld.unsqueeze(-1)  # [B, T, H, 1]: one decay value per step
    fwd, bwd = chunk_cumsum(gl, layout, False), chunk_cumsum(gl, layout, True)
    dot = dot_code(q, k, v)
    f32 = torch.float32
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                          shape=[B, T, H, K, V], chunk=a.chunk)))
    rows = []
    for ones in (False, True):
        calls = {
            "forward": lambda: chunk_states(k, v, fwd, None, None, layout, False, dot, bf, gate=u, ones=ones),
            "backward dS": lambda: chunk_states(q, do, bwd, None, None, layout, True, dot, f32, scale=0.1,
                                                ones=ones, e=e if ones else None),
        }
        g = calls["backward dS"]()
        g_n = g[3][0] if ones else None
        calls["backward S + border terms"] = lambda: chunk_states(k, v, fwd, None, None, layout, False, dot, bf,
                                                                  partner=g[0], gate=u, ones=ones,
                                                                  partner_n=g_n)
        f = calls["backward S + border terms"]()
        fw = calls["forward"]()
        if ones:  # the backward's way since session 46: the forward's column borders given, not summed again
            calls["backward S + border terms, n given"] = lambda: chunk_states(
                k, v, fwd, None, None, layout, False, dot, bf, partner=g[0], gate=u, partner_n=g_n,
                n_given=fw[3][0])
        f_n = f[3][0] if ones else None
        calls["output forward"] = lambda: chunk_output(q, k, v, fwd, None, fw[0], None, 0.1, layout, False, dot, bf,
                                                       gate=u, ones=(fw[3][0], None) if ones else None)
        calls["output dQ"] = lambda: chunk_output(do, v, k, fwd, None, f[0], None, 0.1, layout, False, dot, bf,
                                                  state_transposed=True, gate=u, dg=(q, None, 1.0, False),
                                                  rank_one=(1, e, f_n, None) if ones else None)
        calls["output dK"] = lambda: chunk_output(v, do, q, bwd, None, g[0], None, 1.0, layout, True, dot, bf,
                                                  scale_intra=0.1, state_transposed=True, gate=u, gate_rows=True,
                                                  dg=(k, None, -1.0, False), du_of=k,
                                                  rank_one=(2, e, g_n, None) if ones else None)
        for name, fn in calls.items():
            fn()
            ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
            rows.append((name, ones, ms))
            print(f"{name:28s} ones={ones!s:5s} {ms:.4f} ms", flush=True)
    for part in ("state", "output"):
        sel = [r for r in rows if r[0].startswith("output") == (part == "output") and "given" not in r[0]]
        sums = {v: sum(r[2] for r in sel if r[1] == v) for v in dict.fromkeys(r[1] for r in sel)}
        print(f"{part} calls, sum without / with ones:",
              " ".join(f"{x:.4f}" for x in sums.values()))


if __name__ == "__main__":
    main()
