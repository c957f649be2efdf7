"""Tests for the gaps a mutation audit of the suite found (session 25): changes to the library that no test caught.
Each test names the mutation it kills."""
import math
import os

import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import KINDS, compare_with_reference, fresh_seed, make_inputs
from test_ops_refs import ref_mlstm_exp
from ula.core.autograd import LOG_DECAY_FLOOR
from ula.layers import HGRN2Layer, RetNetLayer

TRITON = os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
BACKENDS = ["torch"] + (["triton"] if TRITON else [])


@pytest.mark.parametrize("cu", [(0, 16, 45), (0, 32, 50)])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_sequence_ending_on_a_chunk_border(cu, kind, right, reverse, backend):
    """A middle sequence whose length is a multiple of the chunk: its decay gradients must not read the next
    sequence's first step (decay_grad.py's chunk layout `<` made `<=` gave dld errors of 0.2 here)."""
    if backend == "triton" and cu != (0, 16, 45):
        pytest.skip("one layout is enough for the slower interpreter")
    seed = fresh_seed()
    cu = torch.tensor(cu)
    q, k, v, ld, rd, s0 = make_inputs(kind, right, 1, int(cu[-1]), 2, 16, 12, N=2)
    errs = compare_with_reference(lambda *a, **kw: ula.linear_attention(*a, chunk_size=16, backend=backend, **kw),
                                  (q, k, v, ld, rd, s0), cu_seqlens=cu, reverse=reverse)
    tol = {"dld": 5e-5} if kind == "constant" else {}
    bad = {n: f"{e:.2e}" for n, e in errs.items() if not e <= tol.get(n, 1e-5)}
    assert not bad, f"relative errors over 1e-5: {bad} (seed {seed})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["scalar", "vector", "right"])
def test_floored_decay_steps_get_exactly_zero_gradient(backend, kind):
    """Log decays below LOG_DECAY_FLOOR are floored as the kernels read them, so their gradient is exactly 0 (the
    Triton decay-gradient kernel without its floor mask gave 5.7e-4 there, hidden by norm-relative tolerances)."""
    fresh_seed()
    B, T, H, K, V = 1, 40, 2, 16, 8
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    shape = {"scalar": (B, T, H), "vector": (B, T, H, K), "right": (B, T, H, V)}[kind]
    g = F.logsigmoid(torch.randn(shape) + 3)
    g[:, 10] = -1e4            # mid-chunk steps (chunk 16), below the floor
    g[:, 25, :, ...] = -500.0
    floored = g <= LOG_DECAY_FLOOR
    g.requires_grad_(True)
    ld, rd = (None, g) if kind == "right" else (g, None)
    o, S = ula.linear_attention(q, k, v, ld, rd, output_final_state=True, chunk_size=16, backend=backend)
    (o.square().sum() + S.sum()).backward()
    assert torch.isfinite(g.grad).all()
    assert torch.count_nonzero(g.grad[floored]) == 0, g.grad[floored].abs().max()
    assert torch.count_nonzero(g.grad[~floored]) > 0  # the rest does get a gradient


def test_hgrn2_lower_bound_decay():
    """HGRN2's forget gate with a lower bound β is β + (1 − β) σ(f) (dropping (1 − β) went unnoticed)."""
    fresh_seed()
    beta, d, H = 0.5, 32, 2
    m = HGRN2Layer(d, H, lower_bound=beta)
    x = torch.randn(2, 7, d)
    g = m._inputs(x)[2]  # log decay, heads split
    want = torch.log(beta + (1 - beta) * torch.sigmoid(m.f_proj(x).float()))
    torch.testing.assert_close(g, want.view(2, 7, H, -1), rtol=1e-5, atol=1e-6)
    assert (g >= math.log(beta) - 1e-6).all()


def test_retnet_learned_decay_starts_at_retnets_decays():
    """RetNet with learn_decay=True starts from RetNet's fixed per-head decays: the same output as the fixed layer
    with the same weights (a start value of θ = log λ instead of log λ − log(1 − λ) went unnoticed)."""
    fresh_seed()
    d, H = 32, 4
    learned = RetNetLayer(d, H, learn_decay=True)
    fixed = RetNetLayer(d, H)
    fixed.load_state_dict({n: p for n, p in learned.state_dict().items() if n != "decay_logit"})
    torch.testing.assert_close(F.logsigmoid(learned.decay_logit), ula.retnet_log_decay(H), rtol=1e-5, atol=1e-6)
    x = torch.randn(2, 9, d)
    torch.testing.assert_close(learned(x)[0], fixed(x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlstm_exp_varlen_without_initial_state(backend):
    """mLSTMexp packed without an initial state: every sequence starts at m_0 = 0, and its final (C, n, m) and
    outputs are the reference's (dropping the m_0 = 0 floor of the torch path was caught by one other test only)."""
    fresh_seed()
    cu = [0, 5, 21, 40]
    T, H, K, V = cu[-1], 2, 16, 8
    q, k, v = (torch.randn(1, T, H, D, dtype=torch.float64) for D in (K, K, V))
    i, f = torch.randn(1, T, H, dtype=torch.float64) - 1, torch.randn(1, T, H, dtype=torch.float64) + 2
    dt = torch.float32 if backend == "triton" else torch.float64
    o, (C, n, m) = ula.mlstm(*(x.to(dt) for x in (q, k, v, i, f)), variant="exp", output_final_state=True,
                             cu_seqlens=torch.tensor(cu), chunk_size=16, backend=backend)
    tol = dict(rtol=1e-4, atol=1e-5) if dt == torch.float32 else dict(rtol=1e-9, atol=1e-10)
    for s in range(3):
        a, b = cu[s], cu[s + 1]
        ro, (rC, rn, rm) = ref_mlstm_exp(q[:, a:b], k[:, a:b], v[:, a:b], i[:, a:b], f[:, a:b])
        torch.testing.assert_close(o[:, a:b].double(), ro, **tol)
        torch.testing.assert_close(m[s:s + 1].double(), rm, **tol)
        # C and n are kept relative to m: compare them scaled back (C exp(m))
        torch.testing.assert_close((C[s:s + 1].double() * m[s:s + 1].double().exp()[..., None, None]),
                                   rC * rm.exp()[..., None, None], **tol)
        torch.testing.assert_close((n[s:s + 1].double() * m[s:s + 1].double().exp()[..., None]),
                                   rn * rm.exp()[..., None], **tol)
