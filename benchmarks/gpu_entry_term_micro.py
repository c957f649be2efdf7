"""The context-parallel entry term's kernels alone, at one rank's slice as mLSTMexp runs them on 2 GPUs
(B1 L65536 H16 K128 bf16, a scalar log decay): the values' call (V=128, bf16 operands) alone, and with the
normalizer's column beside E (float32 both ways, from the same reads of q), forward, forward+backward with all
gradients (q, the decay, E, the column), and forward+backward with the state's alone (q and the decay detached, as
context parallelism's eager runs ask), median of CUDA-event timings. --vector: GLA's case instead, a log decay per
feature (float32, [B, L, H, K]), the values' call only, the state's gradient alone.
Usage: python3 benchmarks/gpu_entry_term_micro.py [--L 65536] [--reps 30] [--vector] -> JSON on stdout."""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_context_parallel import timed  # noqa: E402  (median of CUDA-event timings)
from ula.core.cp_entry import add_entry_term  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--L", type=int, default=65536)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--vector", action="store_true")
    a = p.parse_args()
    dev = torch.device("cuda")
    B, L, H, K = 1, a.L, a.H, a.K
    q0 = torch.randn(B, L, H, K, device=dev, dtype=torch.bfloat16)
    gl0 = F.logsigmoid(torch.randn(B, L, H, K if a.vector else 1, device=dev) + 4)  # canonical
    res = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "triton": triton.__version__,
           "shape": dict(B=B, L=L, H=H, K=K), "vector": a.vector, "tune": os.environ.get("ULA_ENTRY_TUNE"), "ms": {}}
    V = 128
    E = torch.randn(B, H, K, V, device=dev, dtype=torch.float32).requires_grad_()
    En = torch.randn(B, H, K, 1, device=dev, dtype=torch.float32).requires_grad_()
    o = torch.randn(B, L, H, V, device=dev, dtype=torch.bfloat16)
    den = torch.randn(B, L, H, device=dev, dtype=torch.float32)
    do, dden = torch.randn_like(o), torch.randn_like(den)
    for name, col in (("values", False), ("values_with_column", True)) if not a.vector else (("values", False),):
        for grads in ("state", "all") if not a.vector else ("state",):
            q, gl = (q0.detach().requires_grad_(), gl0.detach().requires_grad_()) if grads == "all" else (q0, gl0)

            def fwd():
                if col:
                    return add_entry_term(o, q, gl, None, E, K ** -0.5, False, "triton", column=(den, En))
                return (add_entry_term(o, q, gl, None, E, K ** -0.5, False, "triton"),)

            def fwd_bwd():
                torch.autograd.backward(fwd(), (do, dden)[:1 + col])
            if grads == "state":
                with torch.no_grad():
                    res["ms"][f"{name}_fwd"] = round(timed(fwd, a.reps), 4)
            res["ms"][f"{name}_fwd_bwd_{grads}"] = round(timed(fwd_bwd, a.reps), 4)
    res["ms"]["q_pass_floor"] = round(q0.numel() * 2 / 4.8e9, 4)  # one read of q at 4.8 TB/s, in ms
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
