"""How much of a context-parallel forward+backward is the host's: per rank, for each family, its slice alone
(cp_group=None) and with cp_group = the world:

    ms         GPU time of one forward+backward (CUDA events, median), started right after a barrier
    ms_ahead   the same with the host running ahead: a long GPU sleep is queued first, so the events time the GPU's
               own work (what the call would take inside a model whose host is ahead of its GPU)
    host_fwd_ms, host_ms   the host's time to enqueue the forward, and forward+backward (medians)

and with --cprofile, the Python functions that take the host's time in the context-parallel forwards (rank 1).

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_host.py [--kinds mlstm_exp]
        [--T 131072] [--cprofile]
"""
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


def measure(q, k, v, ld, group, kind, reps):
    run = lambda: fwd_bwd(q, k, v, ld, group, kind)  # noqa: E731
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
        o, _ = forward(q, k, v, ld, group, kind)
        fw.append((time.perf_counter() - t0) * 1e3)
        o.backward(torch.ones_like(o))
        torch.cuda.synchronize()
    res["host_fwd_ms"] = round(statistics.median(fw), 3)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="mlstm_exp,mlstm_sig,gla")
    ap.add_argument("--T", type=int, default=131072)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cprofile", action="store_true")
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, R = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    world = dist.group.WORLD
    for kind in a.kinds.split(","):
        q, k, v, ld = rank_slice(kind, a.T, dev, rank, R)
        res = {"rank": rank, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
               "triton": triton.__version__, "kind": kind, "T_total": a.T}
        for name, group in (("alone", None), ("cp", world)):
            res[name] = measure(q, k, v, ld, group, kind, a.reps)
        text = ""
        if a.cprofile:  # the forward alone, each after a barrier and a synchronize (as `host_fwd_ms`)
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
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
