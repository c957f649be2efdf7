"""The fused backwards (ula/core/triton/backward.py, for a left decay and for a right decay alone) free their border
states as soon as their last reader is done: each is one of the largest buffers of a forward+backward ([B, H, T/C,
K, V]), and one kept alive a pass too long raised the peak by that much (found on an H100 in session 8: +64 MiB at
B2 T8192, a tuple held a deleted one)."""
import weakref

import pytest
import torch

import ula


@pytest.mark.parametrize("side", ["left", "right"])
def test_border_states_are_freed_after_their_last_pass(monkeypatch, side):
    """A left decay (fused_backward) and a right decay alone (fused_backward_right, GSA's first pass)."""
    import ula.core.triton.backward as bw
    refs, seen = [], []
    real_states, real_output, real_grad = bw.chunk_states, bw.chunk_output, bw.decay_grad_from_terms

    def states(*a, **kw):
        out = real_states(*a, **kw)
        refs.append(weakref.ref(out[0]))
        return out

    def output(*a, **kw):
        seen.append([r() is not None for r in refs])
        return real_output(*a, **kw)

    def grad(*a, **kw):
        seen.append([r() is not None for r in refs])
        return real_grad(*a, **kw)

    monkeypatch.setattr(bw, "chunk_states", states)
    monkeypatch.setattr(bw, "chunk_output", output)
    monkeypatch.setattr(bw, "decay_grad_from_terms", grad)
    B, T, H, K, V = 1, 40, 2, 16, 16
    q, k, v = (torch.randn(B, T, H, d).requires_grad_() for d in (K, K, V))
    if side == "left":
        ld, rd = torch.nn.functional.logsigmoid(torch.randn(B, T, H) + 3).requires_grad_(), None
    else:
        ld, rd = None, torch.nn.functional.logsigmoid(torch.randn(B, T, H, V) + 3).requires_grad_()
    o, _ = ula.linear_attention(q, k, v, ld, rd, chunk_size=16, backend="triton")
    refs.clear()  # the forward's own states
    seen.clear()
    o.sum().backward()
    # refs: [state gradients (g), forward states (f)]; calls: dQ, dK, dV passes, then the decay gradient
    assert len(refs) == 2 and len(seen) == 4, (len(refs), len(seen))
    assert seen[0] == [True, True]    # dQ pass reads f
    assert seen[1] == [True, False]   # dK pass: f freed
    assert seen[2] == [True, False]   # dV pass reads g
    assert seen[3] == [False, False]  # the decay gradient: g freed too
