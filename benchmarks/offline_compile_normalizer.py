"""Why v' = [v, 1] (V + 1 = 129 value columns) was slow on the H100 (benchmarks/RESULTS.md, session 4), read off
the GPU compiler on the CPU: the kernels of mLSTMexp's core call (scalar decay, key gate, bf16) compiled for
sm_90 with V = 128; V = 129 as the kernels saw it then (a row stride that is not a multiple of 16, so no aligned
wide loads); and V = 129 as `linear_attention` runs it now (zero columns up to 144: ula.core.api._pad_to_16).
ptxas' registers, spills and shared memory per configuration.

    env -u TRITON_INTERPRET PYTHONPATH=.:tests python3 benchmarks/offline_compile_normalizer.py"""
import torch
import torch.nn.functional as F

import ula
import ula.core.api as api
from offline_compile import record, report

B, T, H, K = 2, 300, 2, 128


def mlstm_exp_core_call(V):
    def run():
        g = torch.Generator().manual_seed(0)
        r = lambda *s: torch.randn(*s, generator=g).bfloat16().requires_grad_()  # noqa: E731
        q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
        ld = F.logsigmoid(torch.randn(B, T, H) + 3).requires_grad_()
        u = F.logsigmoid(torch.randn(B, T, H)).requires_grad_()
        o, S = ula.linear_attention(q, k, v, ld, key_gate=u, output_final_state=True, backend="triton")
        (o.float().sum() + S.sum()).backward()
    return run


def kernels(V):
    return [x for x in record(mlstm_exp_core_call(V)) if x[0].fn.__name__ in ("_state_kernel", "_output_kernel")]


if __name__ == "__main__":
    print("== V = 128")
    report(kernels(128))
    pad = api._pad_to_16
    api._pad_to_16 = lambda n: 0
    try:
        print("== V = 129, rows of 129 (unpadded, as in session 4)")
        report(kernels(129))
    finally:
        api._pad_to_16 = pad
    print("== V = 129, padded to 144 by linear_attention")
    report(kernels(129))
