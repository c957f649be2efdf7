"""Where the time of a context-parallel forward+backward goes (torch.profiler on every rank, printed by rank).

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py [--kind scalar] [--T 262144]"""
import argparse
import os
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_context_parallel import fwd_bwd, make  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="scalar")
    ap.add_argument("--T", type=int, default=262144)
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, R = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    q, k, v, ld = make(a.kind, 1, a.T, dev, 0)
    n = a.T // R
    sl = lambda x: x[:, rank * n:(rank + 1) * n].contiguous()  # noqa: E731
    q, k, v = sl(q), sl(k), sl(v)
    ld = sl(ld) if ld is not None and ld.dim() > 1 else ld
    for _ in range(2):
        fwd_bwd(q, k, v, ld, dist.group.WORLD)
    torch.cuda.synchronize()
    dist.barrier()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fwd_bwd(q, k, v, ld, dist.group.WORLD)
        torch.cuda.synchronize()
    for r in range(R):
        dist.barrier()
        if r == rank:
            ka = prof.key_averages()
            print(f"== rank {rank}: by device time", flush=True)
            print(ka.table(sort_by="device_time_total", row_limit=14, max_name_column_width=60), flush=True)
            print(f"== rank {rank}: by CPU time", flush=True)
            print(ka.table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=60), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
