"""Where the time of a context-parallel forward+backward goes (torch.profiler on every rank, printed by rank).

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py [--kind scalar]
        [--T 262144] [--phases [--cprofile]] [--trace]

--phases: instead of the profiler, per rank and kind (--kind may list several), three variants: `alone` (each rank
its slice, cp_group=None: the ideal), `cp` (cp_group = the world), `cp_no_entry` (the entering state's correction
replaced by nothing: what it costs); for each, one JSON line per rank with
    ms          GPU time of one forward+backward (CUDA events, median), started right after a barrier
    ms_ahead    the same with the host running ahead: a long GPU sleep is queued first, so the events time the GPU's
                own work (what the call would take inside a model whose host is ahead of its GPU)
    host_ms, host_fwd_ms   the host's time to enqueue forward+backward, and the forward alone (medians)
    peak_GiB    peak memory
and with --cprofile the Python functions that take the host's time in 5 context-parallel forwards (last rank)."""
import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_context_parallel import forward, fwd_bwd, rank_slice  # noqa: E402
import ula.core.context_parallel as cpm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="scalar", help="a core decay kind, or gla, mlstm_sig, mlstm_exp (--phases: a "
                                                     "comma-separated list)")
    ap.add_argument("--T", type=int, default=262144)
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--cprofile", action="store_true", help="with --phases: cProfile of the cp forwards")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--trace", action="store_true", help="also write $OUT/cp_trace_rank<r>.json")
    a = ap.parse_args()
    if "," in a.kind and not a.phases:
        ap.error("--kind: one kind without --phases")
    dist.init_process_group("nccl")
    rank, R = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    if a.phases:
        for kind in a.kind.split(","):
            phases(kind, *rank_slice(kind, a.T, dev, rank, R), a, rank, R)
        dist.destroy_process_group()
        return
    q, k, v, ld = rank_slice(a.kind, a.T, dev, rank, R)
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


def measure(run, fwd, reps):
    """ms, ms_ahead, host_ms, host_fwd_ms of run() (forward+backward) and fwd() (the forward's output), medians."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    res = {}
    for ahead in (False, True):
        times, hosts = [], []
        for _ in range(reps):
            dist.barrier()
            torch.cuda.synchronize()
            if ahead:
                torch.cuda._sleep(50_000_000)  # ~25 ms at ~2 GHz: the host queues the whole call meanwhile
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            t0 = time.perf_counter()
            run()
            hosts.append((time.perf_counter() - t0) * 1e3)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        res["ms_ahead" if ahead else "ms"] = round(statistics.median(times), 3)
        if not ahead:
            res["host_ms"] = round(statistics.median(hosts), 3)
    fw = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        o = fwd()
        fw.append((time.perf_counter() - t0) * 1e3)
        o.backward(torch.ones_like(o))
        torch.cuda.synchronize()
    res["host_fwd_ms"] = round(statistics.median(fw), 3)
    return res


def phases(kind, q, k, v, ld, a, rank, R):
    dev = q.device
    world = dist.group.WORLD
    real_entry = cpm.add_entry_term

    def no_entry(o, q, gl, rd, E, scale, reverse, backend, column=None):
        out = o + (E.sum() * 0).to(o.dtype)  # tied to E: the backward still runs every collective
        return out if column is None else (out, column[0] + (column[1].sum() * 0).to(column[0].dtype))

    res = {"rank": rank, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "triton": triton.__version__, "kind": kind, "T_total": a.T}
    variants = (("alone", None, real_entry), ("cp", world, real_entry), ("cp_no_entry", world, no_entry))
    for name, group, entry in variants:
        cpm.add_entry_term = entry
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        res[name] = measure(lambda: fwd_bwd(q, k, v, ld, group, kind), lambda: forward(q, k, v, ld, group, kind)[0],
                            a.reps)
        res[name]["peak_GiB"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)
    cpm.add_entry_term = real_entry
    text = ""
    if a.cprofile:  # the forward alone, each after a barrier and a synchronize (as host_fwd_ms)
        prof = cProfile.Profile()
        for _ in range(5):
            dist.barrier()
            torch.cuda.synchronize()
            prof.enable()
            o, _ = forward(q, k, v, ld, world, kind)
            prof.disable()
            o.backward(torch.ones_like(o))
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
        text = s.getvalue()
    for r in range(R):
        dist.barrier()
        if r == rank:
            print(json.dumps(res), flush=True)
            if text and rank == R - 1:
                print(f"== rank {rank}, {kind}: cProfile of 5 context-parallel forwards, cumulative\n" + text,
                      flush=True)


if __name__ == "__main__":
    main()
