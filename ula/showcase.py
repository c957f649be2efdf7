"""A short showcase of `ula.linear_attention` on this machine's device (until `ula demo` exists):
every decay kind, forward and backward, compared with the float64 reference recurrence."""
import time

import torch
import torch.nn.functional as F

import ula


def _inputs(kind, B, T, H, K, V, device):
    q, k = torch.randn(B, T, H, K, device=device), torch.randn(B, T, H, K, device=device)
    v = torch.randn(B, T, H, V, device=device)
    ld = {"none": None,
          "constant": F.logsigmoid(torch.randn(H, device=device) + 3),
          "scalar": F.logsigmoid(torch.randn(B, T, H, device=device) + 3),
          "vector": F.logsigmoid(torch.randn(B, T, H, K, device=device) + 3)}[kind]
    return q, k, v, ld


def _rel(a, b):
    return ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, T, H, K, V = 1, 300, 2, 32, 48
    print(f"ula {ula.__version__} on {device} (torch {torch.__version__}); B={B} T={T} H={H} K={K} V={V}")
    print(f"{'decay':<10}{'rel err o':>12}{'rel err dq':>12}{'rel err dld':>13}{'fwd+bwd ms':>12}")
    for kind in ("none", "constant", "scalar", "vector"):
        q, k, v, ld = _inputs(kind, B, T, H, K, V, device)
        leaves = [x.requires_grad_() for x in (q, k, v, ld) if x is not None]
        t0 = time.perf_counter()
        o, _ = ula.linear_attention(q, k, v, ld)
        o.square().sum().backward()
        ms = (time.perf_counter() - t0) * 1e3
        got = [o.detach()] + [x.grad for x in leaves]
        for x in leaves:
            x.grad = None
        o_ref, _ = ula.reference_linear_attention(q, k, v, ld)
        o_ref.square().sum().backward()
        ref = [o_ref.detach()] + [x.grad for x in leaves]
        errs = [_rel(got[0], ref[0]), _rel(got[1], ref[1]), _rel(got[-1], ref[-1]) if ld is not None else float("nan")]
        print(f"{kind:<10}{errs[0]:>12.1e}{errs[1]:>12.1e}{errs[2]:>13.1e}{ms:>12.1f}")
    print("All errors are relative to the float64 step-by-step recurrence.")


if __name__ == "__main__":
    main()
