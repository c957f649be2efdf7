"""Seconds per CPU training step of `ula demo`'s models at its defaults (one thread, after 5 warm-up steps): for
timing a change to the PyTorch path against its parent, alternating the two trees in one session.

    PYTHONPATH=TREE python3 benchmarks/cpu_demo_steps.py MIXER [STEPS]     # prints: MIXER seconds-per-step"""
import dataclasses
import sys
import time

import torch

from ula.demo import runner


def main():
    name, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    torch.set_num_threads(1)
    cfg = runner.DemoConfig()
    runner.train_one(name, dataclasses.replace(cfg, steps=5), 0, torch.device("cpu"), bar=False)
    t = time.perf_counter()
    runner.train_one(name, dataclasses.replace(cfg, steps=steps), 0, torch.device("cpu"), bar=False)
    print(name, round((time.perf_counter() - t) / steps, 4))


if __name__ == "__main__":
    main()
