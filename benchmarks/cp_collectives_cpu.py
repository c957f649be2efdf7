"""All-gather vs ring send/recv for the cross-rank state scan of context parallelism, CPU gloo.

    .venv/bin/python benchmarks/cp_collectives_cpu.py > benchmarks/cp_collectives_cpu.txt

Times the communication pattern of one forward + backward of ula/core/context_parallel.py's scan,
for a state of n float32 values (B·H·K·V plus the slice's log-decay sums) per rank:
  all-gather: forward one all_gather ([n] -> [R, n]); backward one all_reduce of [R, n] (what the module
              does on gloo, which has no reduce-scatter);
  all-gather/reduce: the same forward; backward R reduces, rank j receiving the sum of row j (the data of
              a reduce-scatter, which gloo lacks);
  ring:       forward R - 1 dependent hops (rank r receives the entering state from r - 1, sends its exit
              state to r + 1); backward the same chain the other way.
Median over repetitions of the slowest rank's time (max over ranks, each repetition after a barrier).
"""
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [("H=16 K=V=64", 16 * 64 * 64), ("H=16 K=V=128", 16 * 128 * 128), ("B=4 H=16 K=V=128", 4 * 16 * 128 * 128)]
REPS = 15


def _allgather(x, R):
    out = [torch.empty_like(x) for _ in range(R)]
    dist.all_gather(out, x)
    g = torch.stack(out)
    dist.all_reduce(g)  # backward
    return g


def _allgather_reduce(x, R, rank):
    out = [torch.empty_like(x) for _ in range(R)]
    dist.all_gather(out, x)
    g = torch.stack(out)
    for j in range(R):  # backward as R reduces (a reduce-scatter that gloo lacks): rank j gets the sum of row j
        dist.reduce(g[j], dst=j)
    return g[rank]


def _ring(x, R, rank):
    E = torch.zeros_like(x)
    if rank > 0:
        dist.recv(E, rank - 1)
    if rank < R - 1:
        dist.send(x + E, rank + 1)
    dE = torch.zeros_like(x)  # backward: the gradient flows from the last rank to the first
    if rank < R - 1:
        dist.recv(dE, rank + 1)
    if rank > 0:
        dist.send(x + dE, rank - 1)
    return E


def _worker(rank, R, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=R)
    torch.set_num_threads(1)
    res = {}
    for name, n in SIZES:
        x = torch.randn(n)
        for pattern in ("all-gather", "all-gather/reduce", "ring"):
            times = []
            for it in range(REPS + 2):
                dist.barrier()
                t0 = time.perf_counter()
                if pattern == "all-gather":
                    _allgather(x, R)
                elif pattern == "ring":
                    _ring(x, R, rank)
                else:
                    _allgather_reduce(x, R, rank)
                dt = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                if it >= 2:
                    times.append(dt.item())
            res[(name, pattern)] = statistics.median(times)
    if rank == 0:
        q.put(res)
    dist.destroy_process_group()


def main():
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, gloo on 127.0.0.1; median of {REPS} (max over ranks)")
    print(f"{'R':>2} {'state':>18} {'MiB':>6} {'all-gather ms':>14} {'ag/reduce ms':>13} {'ring ms':>9}")
    for R in (2, 4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        q = ctx.SimpleQueue()
        mp.spawn(_worker, args=(R, f"tcp://127.0.0.1:{port}", q), nprocs=R, join=True)
        res = q.get()
        for name, n in SIZES:
            print(f"{R:>2} {name:>18} {n * 4 / 2**20:>6.2f} {res[(name, 'all-gather')] * 1e3:>14.2f} "
                  f"{res[(name, 'all-gather/reduce')] * 1e3:>13.2f} "
                  f"{res[(name, 'ring')] * 1e3:>9.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
