"""The core split along T on one GPU (ula/core/time_split.py) at S = 1 (off), 2, 4, 8 segments forced per call, or
`auto` (the default choice): forward and forward+backward ms (medians of CUDA-graph replays) and the peak MiB of a
forward+backward, per decay kind and shape, bfloat16; each S's output and gradients against S = 1's (relative
difference, both bf16); with --errors also each one's relative error against float64 (the PyTorch chunk path on
float64 copies of the inputs), the largest over o and the gradients.

    python3 benchmarks/gpu_time_split.py [--shapes "1,32768,16,128,128;2,8192,16,128,128"] [--kinds none,vector]
        [--segments 1,2,4,auto] [--errors] [--out DIR]

Writes DIR/time_split.json (default $OUT or /tmp) with the device line and library versions, and prints a table."""
import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402
from ula.bench.measure import graph_times, ours  # noqa: E402
from ula.core import time_split  # noqa: E402
from record import smi_line  # noqa: E402
from compare import rel  # noqa: E402


def peak_mib(fn, args):
    leaves = [a for a in args if a.requires_grad]
    for a in leaves:
        a.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(*args).float().sum().backward()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def outputs(fn, args, do):
    leaves = [a for a in args if a.requires_grad]
    for a in leaves:
        a.grad = None
    o = fn(*args)
    o.backward(do)
    # copies: .float() of a float32 grad is that grad itself, which later backward passes may add to
    return [o.detach().float().clone()] + [a.grad.detach().float().clone() for a in leaves]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="1,32768,16,128,128;2,8192,16,128,128;1,65536,16,128,128;8,2048,16,128,128")
    ap.add_argument("--kinds", default="none,constant,scalar,vector")
    ap.add_argument("--segments", default="1,2,4,8")
    ap.add_argument("--errors", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    dev = torch.cuda.get_device_name()
    meta = dict(device=dev, nvidia_smi=smi_line(), sms=torch.cuda.get_device_properties(0).multi_processor_count,
                torch=torch.__version__, triton=triton.__version__, ula=getattr(ula, "__version__", "?"),
                command=" ".join([os.path.basename(sys.executable)] + sys.argv))
    print(json.dumps(meta), flush=True)
    rows = []
    for shape in a.shapes.split(";"):
        B, T, H, K, V = (int(x) for x in shape.split(","))
        for kind in a.kinds.split(","):
            torch.manual_seed(0)
            fn, args = ours(kind, B, T, H, K, V)
            do = torch.randn_like(fn(*args))
            ref = None
            if a.errors:  # float64 copies take the PyTorch chunk path (and are never split)
                a64 = [x.detach().double().requires_grad_(x.requires_grad) for x in args]
                ref = outputs(fn, a64, do.double())
                del a64
            base = None
            for S in a.segments.split(","):
                time_split._FORCED = None if S == "auto" else S
                got = outputs(fn, args, do)
                if base is None:
                    base = got
                diff = max(rel(x, y) for x, y in zip(got, base))
                err = None if ref is None else max(rel(x.double(), y) for x, y in zip(got, ref))
                t_f, t_fb = graph_times(fn, args)
                mem = peak_mib(fn, args)
                row = dict(shape=[B, T, H, K, V], kind=kind, segments=S, fwd_ms=t_f, fb_ms=t_fb, peak_mib=mem,
                           max_rel_diff_vs_first=diff, max_rel_err_vs_float64=err)
                rows.append(row)
                print(f"B{B} T{T} H{H} K{K} V{V} {kind:8s} S={S}: fwd {t_f:.3f} f+b {t_fb:.3f} ms, "
                      f"{mem:.0f} MiB, vs first {diff:.1e}" + ("" if err is None else f", vs float64 {err:.2e}"),
                      flush=True)
            del fn, args, do, base, ref
            torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "time_split.json"), "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
