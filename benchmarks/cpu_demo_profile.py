"""Where a CPU training step of `ula demo` spends its time: torch.profiler's self CPU time per op over N steps of one
mixer's model at the demo's defaults (one thread, after 5 warm-up steps).

    python3 benchmarks/cpu_demo_profile.py MIXER [N]      # e.g. gla 20"""
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.demo import runner  # noqa: E402


def main():
    name, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
    torch.set_num_threads(1)
    cfg = runner.DemoConfig()
    runner.train_one(name, dataclasses.replace(cfg, steps=5), 0, torch.device("cpu"), bar=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        runner.train_one(name, dataclasses.replace(cfg, steps=steps), 0, torch.device("cpu"), bar=False)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
