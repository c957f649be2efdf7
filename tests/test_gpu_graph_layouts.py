"""On a GPU (ULA_TEST_GPU=1): a packed call captured in a CUDA graph before any eager call of its layouts does not
leave them cached for later calls (ula/core/cu_cache.py). Inside a capture, kernels are recorded, not run, so a
layout built there holds its values only after a replay; an eager call right after the capture must build its own.
Each test compares such a call with the same call on another cu_seqlens tensor of the same values."""
import pytest
import torch
import torch.nn.functional as F

from helpers import DEVICE
import ula
from ula.core import cu_cache

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need CUDA (ULA_TEST_GPU=1)")

T, H, K = 300, 2, 32
BOUNDS = [0, 77, 200, T]


def _inputs():
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(1, T, H, K, device=DEVICE, generator=g).bfloat16().requires_grad_() for _ in range(3))
    ld = F.logsigmoid(torch.randn(1, T, H, device=DEVICE, generator=g) + 3).requires_grad_()
    return q, k, v, ld


def _cu():
    return torch.tensor(BOUNDS, device=DEVICE, dtype=torch.int32)


def _on_side_stream(fn):
    """fn() warmed up on a side stream, as a capture wants (autograd's streams included); its result."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn()
    torch.cuda.current_stream().wait_stream(side)
    return out


def _check_captured_then_eager(step, names):
    """step(cu) -> tensors named `names`: run on a fresh cu_seqlens inside a capture (its values read before, as a
    capture cannot read the device), then eagerly before any replay; both (the capture after a replay) must equal
    the same call on another cu_seqlens of the same values, which built its own layouts."""
    reference = _on_side_stream(lambda: [t.clone() for t in step(_cu())])  # also compiles every kernel
    cu = _cu()
    cu_cache.host_values(cu)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(cu)
    eager = [t.clone() for t in step(cu)]  # before any replay
    graph.replay()
    torch.cuda.synchronize()
    for name, e, c, r in zip(names, eager, captured, reference):
        assert torch.equal(e, r), f"{name}: eager call after the capture differs by {(e - r).abs().max().item()}"
        assert torch.equal(c, r), f"{name}: the replay differs by {(c - r).abs().max().item()}"


@pytest.mark.parametrize("chunk_size", [32, 64])
def test_core_layouts_first_built_in_a_capture(chunk_size):
    """The kernels' chunk layout (forward) and the decay gradient's bounds (backward) of a scalar-decayed call."""
    q, k, v, ld = _inputs()

    def step(cu):
        o, _ = ula.linear_attention(q, k, v, ld, cu_seqlens=cu, chunk_size=chunk_size)
        return [o, *torch.autograd.grad(o.float().sum(), (q, k, v, ld))]
    _check_captured_then_eager(step, ("o", "dq", "dk", "dv", "dld"))


@pytest.mark.parametrize("family", ["mlstm_exp_torch", "abc"])
def test_families_packed_layout_first_built_in_a_capture(family):
    """mLSTMexp on the PyTorch path takes the families' per-token map (PackedTokens, kept per cu_seqlens tensor) in its
    gate scan, forward and backward; so does ABC's cumulative softmax (one scan over all tokens since session 34). (Until session 34 this test called gsa(s=w, g=None), which builds no map.)"""
    q, k, v, _ = _inputs()
    g = torch.Generator(device=DEVICE).manual_seed(1)
    w = torch.randn(1, T, H, 8, device=DEVICE, generator=g).requires_grad_()
    i, f = (torch.randn(1, T, H, device=DEVICE, generator=g) for _ in range(2))

    def step(cu):
        if family == "abc":
            o, _ = ula.abc(q, k, v, w, cu_seqlens=cu)
            return [o, *torch.autograd.grad(o.float().sum(), (q, k, v, w))]
        # not di, df: the gate scan's cummax backward adds in float64 atomics, whose order is not fixed on a GPU
        o, _ = ula.mlstm(q, k, v, i, f + 3, cu_seqlens=cu, backend="torch")
        return [o, *torch.autograd.grad(o.float().sum(), (q, k, v))]
    names = ("o", "dq", "dk", "dv") + (("dw",) if family == "abc" else ())
    _check_captured_then_eager(step, names)


def test_first_read_inside_a_capture_is_a_clear_error():
    """A cu_seqlens whose values were never read before a capture: an error that says what to do, not the CUDA
    error of a wait inside a capture; the same tensor works once called eagerly."""
    q, k, v, _ = _inputs()
    reference = _on_side_stream(lambda: ula.linear_attention(q, k, v, cu_seqlens=_cu())[0])
    cu = _cu()
    with pytest.raises(RuntimeError, match="call the op once eagerly with this cu_seqlens tensor before capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            ula.linear_attention(q, k, v, cu_seqlens=cu)
    o, _ = ula.linear_attention(q, k, v, cu_seqlens=cu)
    assert torch.equal(o, reference)
