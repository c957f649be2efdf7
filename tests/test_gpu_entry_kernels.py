"""On a GPU (ULA_TEST_GPU=1): the context-parallel entry term's kernels (ula/core/triton/entry.py) compiled, with
bfloat16 q, against the float64 PyTorch form (ula/core/cp_entry.py). The values' term keeps bfloat16's error; the
normalizer column beside the state keeps float32's through its three bfloat16 parts, which the CPU suite checks
only with emulated operands. The lengths include those where an earlier operand order of the dE kernel hit an
illegal address at 4 warps on an H200 (session 47, benchmarks/RESULTS.md)."""
import pytest
import torch
import torch.nn.functional as F

from helpers import DEVICE, rel
from ula.core.cp_entry import add_entry_term, entry_term

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="compiled entry kernels (ULA_TEST_GPU=1)")


def _inputs(L, decay, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    H, K, V = 4, 128, 128
    r = lambda *s: torch.randn(*s, device=DEVICE, generator=g)  # noqa: E731
    gl = {"none": None, "scalar": F.logsigmoid(r(1, L, H, 1) + 4), "vector": F.logsigmoid(r(1, L, H, K) + 4)}[decay]
    # q and o bfloat16 as the op hands them over; E, the column and den float32 as context parallelism keeps them
    return (r(1, L, H, V).bfloat16(), r(1, L, H, K).bfloat16(), gl, r(1, H, K, V) * 0.1, r(1, L, H),
            r(1, H, K, 1) * 0.1)


@pytest.mark.parametrize("L", [300, 1000, 4096])
@pytest.mark.parametrize("decay,column", [("none", False), ("scalar", False), ("vector", False), ("none", True),
                                          ("scalar", True)])
def test_entry_kernels_bf16_against_float64(L, decay, column):
    o, q, gl, E, den, En = _inputs(L, decay, L)
    E, En = E.requires_grad_(), En.requires_grad_()
    dout, dden = torch.randn_like(o, dtype=torch.float32), torch.randn_like(den)
    scale = q.shape[-1] ** -0.5
    got = add_entry_term(o, q, gl, None, E, scale, False, "triton", column=(den, En) if column else None)
    out, n = got if column else (got, None)
    loss = (out.float() * dout).sum() + ((n * dden).sum() if column else 0)
    grads = torch.autograd.grad(loss, [E, En] if column else [E])
    torch.cuda.synchronize()

    d = lambda x: None if x is None else x.detach().double()  # noqa: E731
    E64, En64 = d(E).requires_grad_(), d(En).requires_grad_()
    want = d(o) + entry_term(d(q), d(gl), None, E64, scale, False)
    want_n = d(den) + entry_term(d(q), d(gl), None, En64, scale, False)[..., 0]
    ((want * d(dout)).sum() + (want_n * d(dden)).sum()).backward()
    assert rel(d(out), want) < 2e-2 and rel(d(grads[0]), E64.grad) < 2e-2
    if column:  # float32's precision, not bfloat16's
        assert rel(d(n), want_n) < 1e-5 and rel(d(grads[1]), En64.grad) < 1e-5
