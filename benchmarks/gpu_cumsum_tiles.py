"""The chunk-local cumsum kernel's tiles (ula/core/triton/cumsum.py) swept on one GPU: GB/s and time per call for
rows x features tiles and warps, forward and reverse, outputs checked bitwise against the default tile's.

    python3 benchmarks/gpu_cumsum_tiles.py [--shapes "1,32768,16,128;2,8192,16,128"] [--chunk 64]"""
import argparse
import json
import os
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.core.autograd import LOG_DECAY_FLOOR  # noqa: E402
from ula.core.triton.chunk import make_layout  # noqa: E402
from ula.core.triton.cumsum import _cumsum_kernel, chunk_cumsum  # noqa: E402
from ula.core.triton.utils import alloc, cdiv, launch  # noqa: E402


def run(g, layout, reverse, BR, BD, warps):
    Bg, T, H, D = g.shape
    out = alloc((Bg, T, H, D), g.device)
    launch(_cumsum_kernel, (layout.n, cdiv(D, BD), Bg * H), g, out, layout.cu, layout.chunk_seq, layout.chunk_start,
           T, H, D, *g.stride(), C=layout.C, BR=BR, BD=BD, REVERSE=reverse, VARLEN=layout.varlen,
           FLOOR=LOG_DECAY_FLOOR, num_warps=warps)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,32768,16,128;2,8192,16,128")
    ap.add_argument("--chunk", type=int, default=64)
    a = ap.parse_args()
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)))
    for sh in a.shapes.split(";"):
        B, T, H, D = (int(x) for x in sh.split(","))
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda") + 4)
        layout = make_layout(B, T, a.chunk, None, g.device)
        nbytes = 2 * g.numel() * 4
        for reverse in (False, True):
            ref = chunk_cumsum(g, layout, reverse)
            ms = do_bench(lambda: chunk_cumsum(g, layout, reverse), warmup=25, rep=200)
            print(json.dumps(dict(shape=sh, reverse=reverse, tile="default", ms=round(ms, 4),
                                  gbps=round(nbytes / ms / 1e6, 1))))
            for BR in (32, 64):
                for BD in (32, 64, 128):
                    for warps in (2, 4, 8):
                        if BR > a.chunk:
                            continue
                        out = run(g, layout, reverse, BR, BD, warps)
                        same = bool(torch.equal(out, ref))
                        ms = do_bench(lambda: run(g, layout, reverse, BR, BD, warps), warmup=25, rep=200)
                        print(json.dumps(dict(shape=sh, reverse=reverse, BR=BR, BD=BD, warps=warps, same=same,
                                              ms=round(ms, 4), gbps=round(nbytes / ms / 1e6, 1))))


if __name__ == "__main__":
    main()
