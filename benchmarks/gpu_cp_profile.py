"""Where the time of a context-parallel forward+backward goes (torch.profiler on every rank, printed by rank).

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py [--kind scalar]
        [--T 262144] [--phases] [--trace]

--phases: instead of the profiler, median CUDA-event timings (and the host's time to enqueue one call, peak memory)
of three variants on every rank, one JSON line per rank: `alone` (each rank its slice, cp_group=None: the ideal),
`cp` (cp_group = the world), `cp_no_entry` (the entering state's correction replaced by nothing: what it costs)."""
import argparse
import json
import os
import sys
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_context_parallel import fwd_bwd, rank_slice, timed  # noqa: E402
import ula.core.context_parallel as cpm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="scalar", help="a core decay kind, or gla, mlstm_sig, mlstm_exp")
    ap.add_argument("--T", type=int, default=262144)
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--trace", action="store_true", help="also write $OUT/cp_trace_rank<r>.json")
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, R = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    q, k, v, ld = rank_slice(a.kind, a.T, dev, rank, R)
    if a.phases:
        phases(q, k, v, ld, a, rank, R)
        dist.destroy_process_group()
        return
    for _ in range(2):
        fwd_bwd(q, k, v, ld, dist.group.WORLD, a.kind)
    torch.cuda.synchronize()
    dist.barrier()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fwd_bwd(q, k, v, ld, dist.group.WORLD, a.kind)
        torch.cuda.synchronize()
    if a.trace:
        prof.export_chrome_trace(os.path.join(os.environ.get("OUT", "."), f"cp_trace_rank{rank}.json"))
    for r in range(R):
        dist.barrier()
        if r == rank:
            ka = prof.key_averages()
            print(f"== rank {rank}: by device time", flush=True)
            print(ka.table(sort_by="device_time_total", row_limit=14, max_name_column_width=60), flush=True)
            print(f"== rank {rank}: by CPU time", flush=True)
            print(ka.table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=60), flush=True)
    dist.destroy_process_group()


def phases(q, k, v, ld, a, rank, R):
    dev = q.device
    world = dist.group.WORLD
    real_entry = cpm.add_entry_term

    def no_entry(o, q, gl, rd, E, scale, reverse, backend, **kw):  # kw: what later versions add (wide=)
        return o + (E.sum() * 0).to(o.dtype)  # tied to E: the backward still runs every collective

    res = {"rank": rank, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "triton": triton.__version__, "kind": a.kind, "T_total": a.T}
    variants = (("alone", None, real_entry), ("cp", world, real_entry), ("cp_no_entry", world, no_entry))
    for name, group, entry in variants:
        cpm.add_entry_term = entry
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        dist.barrier()
        ms = timed(lambda: fwd_bwd(q, k, v, ld, group, a.kind), a.reps, group)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        fwd_bwd(q, k, v, ld, group, a.kind)  # the host's time to enqueue one call (the GPU catches up after)
        host = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        res[name] = {"ms": round(ms, 3), "host_ms": round(host, 3),
                     "peak_GiB": round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)}
    cpm.add_entry_term = real_entry
    for r in range(R):
        dist.barrier()
        if r == rank:
            print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
