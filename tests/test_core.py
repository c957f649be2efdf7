"""The PyTorch chunk path and its backward (the same function, roles swapped) against autograd through
the float64 reference, for every decay kind, right decay, odd lengths, both directions, states and varlen."""
import pytest
import torch

import ula
from helpers import KINDS, compare_with_reference, fresh_seed, make_inputs, rel

TOL = 1e-5
HEADS = [(8, 12), (16, 16), (32, 8)]  # (K, V): K != V, several head sizes


def _check(errs, seed, tol=TOL, kind=None):
    # a constant decay's gradient is one sum over all steps of terms that cancel (a few values, [H]): its
    # relative error is that of a small difference; 1.1e-5 was seen on a rare draw (seed 651887779)
    tols = {"dld": 5 * tol} if kind == "constant" else {}
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= tols.get(k, tol)}
    assert not bad, f"relative errors over {tol}: {bad} (seed {seed})"


@pytest.mark.parametrize("T", [1, 7, 64, 100, 257])
@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_forward_and_gradients(kind, right, chunk, T):
    seed = fresh_seed()
    reverse = bool(T % 2)  # both directions across the T sweep
    K, V = HEADS[(T + chunk) % 3]
    inputs = make_inputs(kind, right, 2, T, 2, K, V)
    errs = compare_with_reference(lambda *a, **kw: ula.linear_attention(*a, chunk_size=chunk, backend="torch", **kw),
                                  inputs, reverse=reverse)
    _check(errs, seed, kind=kind)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_reverse_both_ways_on_same_length(kind, reverse):
    seed = fresh_seed()
    inputs = make_inputs(kind, True, 1, 45, 2, 16, 24)
    errs = compare_with_reference(lambda *a, **kw: ula.linear_attention(*a, chunk_size=16, backend="torch", **kw),
                                  inputs, reverse=reverse)
    _check(errs, seed)


@pytest.mark.parametrize("kind", KINDS)
def test_without_states(kind):
    seed = fresh_seed()
    inputs = make_inputs(kind, False, 2, 70, 3, 16, 8, h0=False)
    errs = compare_with_reference(lambda *a, **kw: ula.linear_attention(*a, chunk_size=16, backend="torch", **kw),
                                  inputs, final=False)
    _check(errs, seed)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_varlen(kind, right, reverse):
    seed = fresh_seed()
    lens = torch.randint(1, 90, (3,))
    lens[0] = 17  # never all equal
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    T = int(cu[-1])
    q, k, v, ld, rd, s0 = make_inputs(kind, right, 1, T, 2, 16, 12, N=3)
    errs = compare_with_reference(lambda *a, **kw: ula.linear_attention(*a, chunk_size=16, backend="torch", **kw),
                                  (q, k, v, ld, rd, s0), cu_seqlens=cu, reverse=reverse)
    _check(errs, seed)


def test_varlen_equals_separate_calls():
    """Packing must not leak state between sequences: each sequence alone gives the same rows."""
    fresh_seed()
    cu = torch.tensor([0, 5, 40, 41])
    q, k, v, ld, rd, s0 = make_inputs("vector", True, 1, 41, 2, 16, 16, N=3)
    o, S = ula.linear_attention(q, k, v, ld, rd, initial_state=s0, output_final_state=True, cu_seqlens=cu,
                                chunk_size=16)
    for n in range(3):
        a, b = int(cu[n]), int(cu[n + 1])
        o1, S1 = ula.reference_linear_attention(q[:, a:b], k[:, a:b], v[:, a:b], ld[:, a:b], rd[:, a:b],
                                                initial_state=s0[n:n + 1], output_final_state=True)
        assert torch.allclose(o[:, a:b].double(), o1, rtol=1e-4, atol=1e-4)
        assert torch.allclose(S[n:n + 1].double(), S1, rtol=1e-4, atol=1e-4)


# each kind in one direction, both directions over the kinds (finite differences are slow; test_varlen and
# test_reverse_both_ways_on_same_length cover every kind in both against the reference)
@pytest.mark.parametrize("kind,reverse", [(kind, i % 2 == 1) for i, kind in enumerate(KINDS)])
def test_gradcheck_float64(kind, reverse):
    fresh_seed()
    q, k, v, ld, rd, s0 = make_inputs(kind, True, 1, 21, 2, 4, 3, dtype=torch.float64)
    cu = torch.tensor([0, 9, 21]) if kind == "scalar" else None
    if cu is not None:
        s0 = torch.randn(2, 2, 4, 3, dtype=torch.float64)

    def f(q, k, v, ld, rd, s0):
        o, S = ula.linear_attention(q, k, v, ld, rd, initial_state=s0, output_final_state=True, chunk_size=16,
                                    cu_seqlens=cu, reverse=reverse, backend="torch")
        return o, S

    args = [x.requires_grad_() for x in (q, k, v, ld if ld is not None else torch.zeros(0), rd, s0)]
    if ld is None:
        args[3] = None
    assert torch.autograd.gradcheck(f, tuple(args), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_second_derivatives_float64(kind):
    """The PyTorch path's backward is made of differentiable ops (ula/core/op.py): second derivatives against finite
    differences, through a chunk and a partial one. Fails if an op's saved output is later modified in place
    (the intra-chunk causal mask applied in place to the decay factors instead of to their product)."""
    fresh_seed()
    q, k, v, ld, _, s0 = make_inputs(kind, False, 1, 21, 1, 2, 2, dtype=torch.float64)

    def f(q, k, v, s0, *ld):
        return ula.linear_attention(q, k, v, *ld, initial_state=s0, output_final_state=True, chunk_size=16,
                                    backend="torch")

    args = [x.requires_grad_() for x in (q, k, v, s0) + ((ld,) if ld is not None else ())]
    assert torch.autograd.gradgradcheck(f, tuple(args), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_extreme_decays_stay_finite():
    """Log decays from 0 down to -1e4 per step: no inf or NaN, and equal to the reference."""
    seed = fresh_seed()
    q, k, v, _, _, s0 = make_inputs("none", False, 1, 77, 2, 16, 16)
    ld = -torch.rand(1, 77, 2, 16) * 1e4 * (torch.rand(1, 77, 2, 16) < 0.3)
    ld[:, :5] = 0.0
    rd = -torch.rand(1, 77, 2, 16) * 1e4 * (torch.rand(1, 77, 2, 16) < 0.1)
    errs = compare_with_reference(lambda *a, **kw: ula.linear_attention(*a, chunk_size=16, backend="torch", **kw),
                                  (q, k, v, ld, rd, s0))
    _check(errs, seed, 1e-5)


def test_output_dtype_and_state_dtype():
    q, k, v, ld, _, s0 = make_inputs("scalar", False, 1, 20, 2, 16, 16)
    o, S = ula.linear_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), ld, initial_state=s0, output_final_state=True)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    o, S = ula.linear_attention(q, k, v, ld)
    assert S is None


def test_default_scale_is_inverse_sqrt_k():
    q, k, v, ld, _, _ = make_inputs("vector", False, 1, 9, 1, 16, 4, h0=False)
    o1, _ = ula.linear_attention(q, k, v, ld)
    o2, _ = ula.linear_attention(q, k, v, ld, scale=0.25)
    o3, _ = ula.linear_attention(q, k, v, ld, scale=1.0)
    assert torch.allclose(o1, o2) and torch.allclose(o1 * 4, o3, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_loss_on_final_state_only(backend):
    """o unused: the backward gets no gradient for o (None, not a zero tensor) and must still be right."""
    seed = fresh_seed()
    q, k, v, ld, _, h0 = make_inputs("scalar", False, 2, 37, 2, 16, 12)
    ours = [x.detach().clone().requires_grad_() for x in (q, k, v, ld, h0)]
    refs = [x.detach().double().requires_grad_() for x in (q, k, v, ld, h0)]
    _, S = ula.linear_attention(*ours[:4], initial_state=ours[4], output_final_state=True, chunk_size=16,
                                backend=backend)
    _, S_ref = ula.linear_attention(*refs[:4], initial_state=refs[4], output_final_state=True, backend="reference")
    w = torch.randn_like(S_ref)
    (S.double() * w).sum().backward()
    (S_ref * w).sum().backward()
    errs = {f"d{n}": rel(a.grad, b.grad) for n, a, b in zip(("q", "k", "v", "ld", "h0"), ours, refs)
            if b.grad is not None and b.grad.abs().sum() > 0}
    assert ours[0].grad is None or float(ours[0].grad.abs().max()) == 0.0  # q does not reach the final state
    _check(errs, seed)
