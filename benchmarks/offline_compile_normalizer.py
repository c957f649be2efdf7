"""Why v' = [v, 1] (V + 1 = 129 value columns) was slow on the H100 (benchmarks/RESULTS.md, session 4), read off
the GPU compiler on the CPU: the kernels of mLSTMexp's core call (scalar decay, key gate, bf16) compiled for
sm_90 with V = 128, 129 (a row stride that is not a multiple of 16, so no aligned wide loads) and 1 (the separate
normalizer call that replaced it), with ptxas' registers, spills and shared memory per configuration.

    env -u TRITON_INTERPRET PYTHONPATH=.:tests python3 benchmarks/offline_compile_normalizer.py"""
import torch
import torch.nn.functional as F

import ula
from offline_compile import record, report

B, T, H, K = 2, 300, 2, 128


def mlstm_exp_core_call(V):
    def run():
        g = torch.Generator().manual_seed(0)
        r = lambda *s: torch.randn(*s, generator=g).bfloat16().requires_grad_()  # noqa: E731
        q, k = r(B, T, H, K), r(B, T, H, K)
        v = r(B, T, H, V) if V != 1 else torch.ones(B, T, H, 1).bfloat16()  # the normalizer's values need no grad
        ld = F.logsigmoid(torch.randn(B, T, H) + 3).requires_grad_()
        u = F.logsigmoid(torch.randn(B, T, H)).requires_grad_()
        o, S = ula.linear_attention(q, k, v, ld, key_gate=u, output_final_state=True, backend="triton")
        (o.float().sum() + S.sum()).backward()
    return run


if __name__ == "__main__":
    for V in (128, 129, 1):
        print(f"== V = {V}")
        report([x for x in record(mlstm_exp_core_call(V)) if x[0].fn.__name__ in ("_state_kernel", "_output_kernel")])
