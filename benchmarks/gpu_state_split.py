"""Splits along T on one GPU for ops over long sequences with few heads, in one process: per op and shape,
forward and forward+backward ms (medians of CUDA-graph replays, bf16) and peak MiB under each setting of the two
splits (module variables, as ULA_TIME_SPLIT / ULA_STATE_SPLIT set them), and each setting's output and gradients
against the unsplit run's (relative Frobenius difference, same bf16 inputs); also the same tokens as rows
(B = S, T / S: the bound a split can reach).

    python3 benchmarks/gpu_state_split.py [--shapes "1,32768,16;1,65536,16;1,16384,8;2,8192,16;16384+16384,8"]
        [--ops linear,scalar,vector,mlstm_exp,mlstm_sig,normalized,gla] [--modes off,entry,state,both] [--rows]
        [--errors]

Modes: off (neither split), entry (ula/core/time_split.py alone: the state kernel unsplit), state (the state
kernel's segments alone, ula/core/triton/state.py), both (the defaults), state2 / state4 (the state kernel's
split forced to 2 / 4 segments, decayed calls too, the other split off). Writes $OUT/state_split.json with the device
line and library versions, and prints a table."""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402
from ula.bench.measure import graph_times, measure  # noqa: E402
from ula.core import time_split  # noqa: E402
from ula.core.triton import state  # noqa: E402
from gpu_time_split import peak_mib  # noqa: E402  (this folder is on the path: the script's own)
from gpu_packed_layers import packed_shape  # noqa: E402
from record import header  # noqa: E402

MODES = {"off": ("1", "1"), "entry": (None, "1"), "state": ("1", None), "both": (None, None),
         "state2": ("1", "2"), "state4": ("1", "4")}


def make(op, B, T, H, D=128, cu=None):
    """(fn, its leaves) of op on random bf16 inputs; cu: the cu_seqlens of packed sequences (B = 1)."""
    fn, args = _make(op, B, T, H, D)
    if cu is None:
        return fn, args
    return (lambda *a: fn(*a, cu_seqlens=cu)), args


def _make(op, B, T, H, D):
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*s, sc=1.0):
        return (torch.randn(*s, device="cuda", generator=g) * sc).to(torch.bfloat16).requires_grad_()

    q, k, v = r(B, T, H, D, sc=D ** -0.5), r(B, T, H, D, sc=D ** -0.5), r(B, T, H, D)
    i = (torch.randn(B, T, H, device="cuda", generator=g) - 2).requires_grad_()
    f = (torch.randn(B, T, H, device="cuda", generator=g) + 4).requires_grad_()
    gv = F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=g) + 4).requires_grad_()
    if op.startswith("mlstm"):
        return (lambda q, k, v, i, f, **kw: ula.mlstm(q, k, v, i, f, variant=op[6:], **kw)[0]), [q, k, v, i, f]
    if op == "normalized":
        return (lambda q, k, v, **kw: ula.normalized_linear_attention(q, k, v, **kw)[0]), [q, k, v]
    if op == "linear":
        return (lambda q, k, v, **kw: ula.linear_attention(q, k, v, **kw)[0]), [q, k, v]
    if op == "scalar":
        return (lambda q, k, v, f, **kw: ula.linear_attention(q, k, v, F.logsigmoid(f), **kw)[0]), [q, k, v, f]
    if op == "vector":
        return (lambda q, k, v, g, **kw: ula.linear_attention(q, k, v, g, **kw)[0]), [q, k, v, gv]
    if op == "gla":
        return (lambda q, k, v, g, **kw: ula.gla(q, k, v, g, **kw)[0]), [q, k, v, gv]
    raise ValueError(op)


def set_mode(mode):
    time_split._FORCED, state._FORCED = MODES[mode]


def outputs(fn, args):
    for a in args:
        a.grad = None
    o = fn(*args)
    do = torch.randn(o.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(o.dtype)
    o.backward(do)
    # copies: .float() of a float32 grad is that grad itself, which the timing's backward passes then add to
    return [o.detach().float().clone()] + [a.grad.detach().float().clone() for a in args]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="1,32768,16;1,65536,16;1,16384,8;2,8192,16")
    ap.add_argument("--ops", default="linear,scalar,vector,mlstm_exp,mlstm_sig,normalized,gla")
    ap.add_argument("--modes", default="off,entry,state,both")
    ap.add_argument("--rows", action="store_true", help="also the same tokens as S = 2 rows")
    ap.add_argument("--errors", action="store_true", help="also each setting's error against the op on float32 "
                    "copies of the inputs (unsplit), the largest relative Frobenius error over o and the gradients")
    a = ap.parse_args()
    res = header()
    print(res["device"], res["torch"], res["triton"], flush=True)
    for shape in a.shapes.split(";"):
        cu = None
        if "+" in shape:  # packed sequences "L1+L2+...,H" (B = 1): eager medians, as a training loop runs them
            lens, H, cu = packed_shape(shape)
            B, T = 1, sum(lens)
        else:
            B, T, H = map(int, shape.split(","))
        for op in a.ops.split(","):
            fn, args = make(op, B, T, H, cu=cu)
            base = ref = None
            line = []
            if a.errors:
                set_mode("off")
                ref = outputs(fn, [x.detach().float().requires_grad_() for x in args])
            for mode in a.modes.split(","):
                set_mode(mode)
                outs = outputs(fn, args)
                diff = None if base is None else max(
                    ((x - y).norm() / y.norm().clamp_min(1e-30)).item() for x, y in zip(outs, base))
                base = outs if base is None else base
                if cu is None:
                    fwd, fb = graph_times(fn, args)
                    mib = peak_mib(fn, args)
                else:
                    fwd, fb, mib = measure(fn, args)
                err = None if ref is None else max(
                    ((x - y).norm() / y.norm().clamp_min(1e-30)).item() for x, y in zip(outs, ref))
                res["results"].append(dict(op=op, B=B, T=T, H=H, lens=shape.split(",")[0] if cu is not None else None,
                                           mode=mode, fwd_ms=fwd, fb_ms=fb, peak_mib=mib,
                                           rel_diff_vs_first=diff, rel_err_vs_float32=err))
                line.append(f"{mode} {fb:.3f}" + ("" if diff is None else f" ({diff:.1e})")
                            + ("" if err is None else f" err {err:.2e}"))
            set_mode("off")
            if a.rows and B == 1:
                fn2, args2 = make(op, 2, T // 2, H)
                fwd, fb = graph_times(fn2, args2)
                res["results"].append(dict(op=op, B=2, T=T // 2, H=H, mode="rows_off", fwd_ms=fwd, fb_ms=fb))
                line.append(f"rows {fb:.3f}")
                del fn2, args2
            print(f"B{B} T{T} H{H} {op:10s} f+b ms: " + ", ".join(line), flush=True)
            save(res)  # after each op: a call cut off by its time limit keeps what it measured
            del fn, args, base, outs, ref
            torch.cuda.empty_cache()
    set_mode("both")
    save(res)


def save(res):
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "state_split.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
