"""On a GPU (ULA_TEST_GPU=1): timing an op leaves the caller's gradients as they were. The benchmarks keep a leaf's
gradient as the result to check; `.float()` of a float32 gradient is that tensor itself, and session 31-32's error
columns for the decayed packed ops read 8-18 because measure's first backward added to it."""
import pytest
import torch
import torch.nn.functional as F

from helpers import DEVICE
import ula
from ula.bench.measure import measure

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="ula.bench.measure times CUDA calls (ULA_TEST_GPU=1)")


def test_measure_leaves_callers_gradients():
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(1, 256, 2, 32, device=DEVICE, generator=g).requires_grad_() for _ in range(3))
    f = (torch.randn(1, 256, 2, device=DEVICE, generator=g) + 3).requires_grad_()

    def fn(q, k, v, f):
        return ula.linear_attention(q, k, v, F.logsigmoid(f))[0]

    fn(q, k, v, f).sum().backward()
    held = [a.grad for a in (q, k, v, f)]
    kept = [x.clone() for x in held]
    measure(fn, [q, k, v, f])
    for x, y in zip(held, kept):
        assert torch.equal(x, y)
