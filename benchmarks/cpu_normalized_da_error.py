"""The gradient of a tensor coefficient a of normalized attention on the PyTorch path against float64: its largest
relative error over N seeds of tests/test_ops_normalized_gsa.py::test_normalized's tensor cases (per-head a and b,
per-head a with a float b; with and without an initial state), and its largest ratio to the float32 recurrence's.

    python3 benchmarks/cpu_normalized_da_error.py [N]     # default 150 (600 draws, ~1 min on one CPU core)"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import ula  # noqa: E402
from test_ops_normalized_gsa import normalized_inputs  # noqa: E402
from test_ops_refs import CHUNK, compare, ref_normalized  # noqa: E402


def main():
    N = int(sys.argv[1]) if len(sys.argv) > 1 else 150
    worst = ratio = 0.0
    over = 0
    for seed in range(N):
        torch.manual_seed(seed)
        for coef in ("tensor", "a_tensor"):
            for h0 in (False, True):
                inp = normalized_inputs(coef, h0)
                errs, errs32 = compare(lambda h0, **x: ula.normalized_linear_attention(
                    **x, initial_state=h0, output_final_state=True, chunk_size=CHUNK, backend="torch"),
                    lambda **x: ref_normalized(**x), inp, ref_float32=True)
                worst, ratio = max(worst, errs["da"]), max(ratio, errs["da"] / errs32["da"])
                over += not errs["da"] <= max(1e-4, 10 * errs32["da"])
    print(f"{N} seeds x 4 cases: largest da error {worst:.2e}, largest ratio to the float32 recurrence's "
          f"{ratio:.1f}, over test_normalized's bar: {over}")


if __name__ == "__main__":
    main()
