"""What each packed op does with cu_seqlens on the CPU beside CUDA tensors (session 38's probe).

    python3 benchmarks/gpu_cu_device_probe.py

Per op: "ok" with its largest difference from the same call with cu_seqlens on the GPU (output and gradients), or
the error's type and first line."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402


def main():
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    torch.manual_seed(0)
    T, H, D, m = 2048, 2, 64, 16
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    lg = lambda *s: F.logsigmoid(torch.randn(*s, device="cuda") + 3)  # noqa: E731
    q, k, v = r(1, T, H, D), r(1, T, H, D), r(1, T, H, D)
    ops = {
        "linear": lambda cu: ula.linear_attention(q, k, v, cu_seqlens=cu)[0],
        "vector": lambda cu: ula.linear_attention(q, k, v, lg(1, T, H, D), cu_seqlens=cu)[0],
        "gla": lambda cu: ula.gla(q, k, v, lg(1, T, H, D), cu_seqlens=cu)[0],
        "mlstm_exp": lambda cu: ula.mlstm(q, k, v, r(1, T, H).float(), r(1, T, H).float() + 3, "exp",
                                          cu_seqlens=cu)[0],
        "mlstm_sig": lambda cu: ula.mlstm(q, k, v, r(1, T, H).float(), r(1, T, H).float() + 3, "sig",
                                          cu_seqlens=cu)[0],
        "gsa": lambda cu: ula.gsa(q, k, v, None, lg(1, T, H, m), cu_seqlens=cu)[0],
        "abc": lambda cu: ula.abc(q, k, v, r(1, T, H, m), cu_seqlens=cu)[0],
        "normalized": lambda cu: ula.normalized_linear_attention(q, k, v, cu_seqlens=cu)[0],
    }
    cu = torch.tensor([0, 100, 1000, T], dtype=torch.int32)
    for name, fn in ops.items():
        out = []
        for c in (cu.cuda(), cu):
            torch.manual_seed(1)
            try:
                o = fn(c)
                torch.cuda.synchronize()
                out.append(o.float())
            except Exception as e:  # noqa: BLE001
                out.append(f"{type(e).__name__}: {str(e).splitlines()[0][:240]}")
        if all(isinstance(o, torch.Tensor) for o in out):
            print(name, "ok, max diff", (out[0] - out[1]).abs().max().item(), flush=True)
        else:
            print(name, out[1] if isinstance(out[1], str) else "", "| on the GPU:",
                  out[0] if isinstance(out[0], str) else "ok", flush=True)


if __name__ == "__main__":
    main()
