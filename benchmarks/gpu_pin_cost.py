"""What context parallelism's metadata gather (ula/core/context_parallel.py, _gather_ints) pays on the host to pin its
two small int64 buffers per call, against copying into buffers pinned once: means of 200 calls, ms.

    python3 benchmarks/gpu_pin_cost.py

A profile of a 2-GPU call had shown ~0.65 ms per pin_memory (results/profile_mlstm_exp_cp_h200x2_session43.txt)."""
import time

import torch


def mean_ms(f, n=200):
    f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    torch.zeros(1, device="cuda")
    vals = list(range(16))
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print("pin src + back per call (ms)", mean_ms(lambda: (torch.tensor(vals, dtype=torch.int64).pin_memory(),
                                                           torch.empty(2 * 16, dtype=torch.int64).pin_memory())))
    src = torch.empty(16, dtype=torch.int64).pin_memory()
    print("copy into a buffer pinned once (ms)", mean_ms(lambda: src.copy_(torch.tensor(vals, dtype=torch.int64))))
    print("the list as a plain tensor (ms)", mean_ms(lambda: torch.tensor(vals, dtype=torch.int64)))


if __name__ == "__main__":
    main()
