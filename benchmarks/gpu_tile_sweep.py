"""Sweep of the Triton kernels' tile sizes and warps (ULA_TUNE_<KERNEL>, see ula/core/triton/utils.py):
forward and forward+backward median ms per configuration, bf16, B=2 T=8192 H=16 K=V=128 (or SHAPE="B,T,H,K,V").

    python3 benchmarks/gpu_tile_sweep.py [vector,vector_c128,none,none_state,state_small:constant,state_small:gsa]
                                          # writes $OUT/tile_sweep.json ($OUT/tile_sweep_$TAG.json with TAG set)
    GRAPH=1 python3 benchmarks/gpu_tile_sweep.py ones_state:mlstm_exp,ones_output:mlstm_exp,chunks:mlstm_exp
                                          # also CUDA-graph replays (fwd_graph_ms, fwdbwd_graph_ms): the GPU's time
                                          # where the host's launches would hide it (mLSTMexp)
A configuration "default" is the kernel's own choice (no override).

The output of each configuration is compared with the default configuration's (a broken tiling shows as
a large difference); correctness itself is checked by benchmarks/gpu_check_triton.py and the tests."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpu_core_vs_peers import measure, ours  # noqa: E402
from ula.bench import families  # noqa: E402
from ula.bench.measure import graph_times  # noqa: E402
from ula.core.triton.utils import set_tuning  # noqa: E402

SHAPE = tuple(int(x) for x in os.environ.get("SHAPE", "2,8192,16,128,128").split(","))
# name -> (decay kind, kernel whose tiles vary, configurations "BT,BK,BV,warps", chunk size or None)
SWEEP = {
    "vector": ("vector", "OUTPUT_VEC", ["16,32,64,4", "32,32,64,4", "32,64,64,4", "64,32,64,4", "64,32,64,8",
                                        "32,32,64,8", "16,64,64,4"], None),
    # session 9: the rows' own block through one reference step (the levels in a second launch)
    "vector_s9": ("vector", "OUTPUT_VEC", ["32,32,128,4", "32,32,128,8", "16,32,128,4", "32,64,128,4", "32,16,128,4",
                                           "64,32,128,8"], None),
    "vector_bt": ("vector", "OUTPUT_VEC", ["16,32,128,4", "32,32,128,4", "32,32,128,8", "32,32,64,4", "32,64,128,8",
                                           "64,32,128,8", "64,64,128,8"], None),
    # chunk 128 with decays per feature: the own block through one reference step (session 9) makes the intra-chunk
    # work grow less with the chunk, and half the chunks halve the sequential state kernels' steps
    "vector_c128": ("vector", "OUTPUT_VEC", ["32,32,128,4", "16,32,128,4", "64,32,128,8", "32,64,128,4"], 128),
    "none": ("none", "OUTPUT", ["64,64,64,4", "64,64,128,8", "128,64,64,8", "64,128,64,8", "32,64,64,4",
                                "64,64,64,8"], None),
    "constant_state": ("constant", "STATE", ["128,64,64,4", "128,64,32,4", "128,32,64,4", "128,32,32,4",
                                             "64,64,32,4", "128,64,64,8"], None),
    "scalar_state": ("scalar", "STATE", ["128,64,64,4", "128,64,32,4", "128,32,32,4", "128,64,64,8"], None),
    # the sequential state kernel with few programs per multiprocessor (session 9's counters: 128 programs, one
    # warp per scheduler, latency-bound): narrower tiles, more programs
    "state_small": (None, "STATE", ["128,64,64,4", "128,32,64,4", "128,64,32,4", "128,32,32,4", "128,16,32,4",
                                    "128,32,16,4", "128,16,64,4", "128,16,16,4", "128,32,32,2", "128,16,32,2"], None),
    "state_w8": (None, "STATE", ["128,64,64,8", "128,32,64,8", "128,64,32,8", "128,32,32,8", "128,16,32,8",
                                 "128,16,64,8", "128,32,32,4"], None),
    "state_small_c128": (None, "STATE", ["128,32,64,4", "128,32,32,4", "128,16,32,4", "128,16,16,4",
                                         "128,32,32,8", "128,16,32,2"], 128),
    "none_state": ("none", "STATE", ["64,64,64,4", "64,64,128,8", "64,128,64,8", "128,64,64,8", "32,64,64,4",
                                     "64,32,64,4", "64,64,32,4"], None),
    # the column of ones with one decay value per step and a key gate (mLSTMexp): state and output kernels
    "ones_state": (None, "STATE", ["default", "128,32,64,4", "128,64,64,8", "128,32,32,8", "128,32,32,4",
                                   "128,32,128,8", "64,32,64,8", "128,16,64,4", "128,64,128,8"], None),
    "ones_output": (None, "OUTPUT", ["default", "64,64,64,4", "64,32,128,4", "32,64,128,4", "64,64,128,8",
                                     "128,64,128,8", "64,128,128,8", "128,64,64,4"], None),
    "chunks": (None, "STATE", ["default"], (64, 128, 256)),
    # session 40, H200: GLA's f+b at 1.008x fla chunk_gla's (0.93-0.95x on the H100): its per-feature launches
    "vec_output_h200": (None, "OUTPUT_VEC", ["default", "32,32,128,8", "16,32,128,4", "32,64,128,4", "32,32,128,4,2",
                                             "32,32,128,4,3"], None),
    "vec_state_h200": (None, "STATE", ["128,64,64,4", "128,32,64,8", "128,64,128,8", "128,64,64,8,2"], None),
}


def main():
    out = os.environ.get("OUT", "/tmp")
    import triton
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                command=" ".join(sys.argv), env={k: v for k, v in os.environ.items() if k in ("SHAPE", "TAG")})
    rows = []
    only = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SWEEP)  # e.g. vector,vector_c128
    for item in only:  # name or name:kind (sweeps without a kind of their own, e.g. state_small:vector)
        name, _, kind_arg = item.partition(":")
        kind, kernel, configs, chunks = SWEEP[name]
        kind = kind or kind_arg
        ref = None
        for C in chunks if isinstance(chunks, tuple) else (chunks,):
            torch.manual_seed(0)
            if kind in families.CORE_KINDS:
                fn, args = ours(kind, *SHAPE, C=C)
            else:  # an op of ula.ops (ula.bench.families), e.g. state_small:gsa
                fn, args = families.as_args(families.ours(kind, C), families.make(kind, *SHAPE, "cuda",
                                                                                  torch.bfloat16))
            if ref is None:
                with torch.no_grad():
                    ref = fn(*args).float()
            for cfg in configs:
                set_tuning(kernel, None if cfg == "default" else cfg)
                try:
                    with torch.no_grad():
                        diff = ((fn(*args).float() - ref).norm() / ref.norm()).item()
                    f, fb, mem = measure(fn, args)
                    rows.append(dict(kind=kind, kernel=kernel, cfg=cfg, chunk=C, fwd_ms=f, fwdbwd_ms=fb,
                                     peak_mib=mem, diff=diff))
                    if os.environ.get("GRAPH") == "1":
                        rows[-1]["fwd_graph_ms"], rows[-1]["fwdbwd_graph_ms"] = graph_times(fn, args)
                except Exception as e:
                    rows.append(dict(kind=kind, kernel=kernel, cfg=cfg, chunk=C, error=repr(e)[:200]))
                print(json.dumps(rows[-1]), flush=True)
            set_tuning(kernel, None)
    json.dump(dict(meta=meta, shape=SHAPE, rows=rows), open(os.path.join(out, f"tile_sweep{'_' + os.environ['TAG'] if os.environ.get('TAG') else ''}.json"), "w"), indent=1)
    print(meta)
    for r in rows:
        if "error" in r:
            print(f"{r['kind']:<8}{r['kernel']:<12}{r['cfg']:<14}{str(r['chunk']):<6} ERROR {r['error'][:80]}")
        else:
            print(f"{r['kind']:<8}{r['kernel']:<12}{r['cfg']:<14}{str(r['chunk']):<6}{r['fwd_ms']:8.3f}{r['fwdbwd_ms']:9.3f}"
                  f"{r['peak_mib']:8.0f}  diff {r['diff']:.1e}"
                  + (f"  graph {r['fwd_graph_ms']:.3f} {r['fwdbwd_graph_ms']:.3f}" if "fwd_graph_ms" in r else ""))


if __name__ == "__main__":
    main()
