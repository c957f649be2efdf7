"""Extreme inputs (the hardening issue, item 2): log decays exactly 0 and down to -1e4 per step, mLSTM input gates
up to +80, GSA / ABC slot logits up to ±1e4, all-zero inputs, T = 1. Everything must stay finite (outputs, final
states, every gradient: `rel` in tests/helpers.py asserts it) and equal the float64 reference.

Tolerances. The core is held to 1e-4, as in tests/test_triton.py: an extreme log decay only makes terms
exp(b_i - b_j) underflow to exactly 0, which the float64 reference does too (exp(-1e4) = 0 in float64), so the
error stays the ordinary float32 rounding of the surviving terms. Exact zeros must come out exactly (a relative
error of x against 0 is |x| / 1e-30). The per-op exceptions are explained where they are made."""
import os

import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import DEVICE, KINDS, compare_with_reference, fresh_seed, make_inputs, rel
from test_ops_refs import compare, per_sequence, ref_gsa, ref_mlstm_exp, ref_mlstm_sig

TOL = 1e-4
TRITON = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                            reason="Triton kernels need CUDA or the interpreter")


def _check(errs, seed, tol=TOL, what=""):
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= tol}
    assert not bad, f"relative errors over {tol}: {bad} (seed {seed}) {what}"


def _extreme_log_decay(shape, ordinary=False):
    """About a third exactly 0, the rest from -1e4 to -200 (a step that wipes the state: exp(-200) = 0 in float32),
    with step 0 and the last steps exactly 0 (runs of no decay) and a run of exactly -1e4. ordinary=True mixes in
    ordinary decays (logσ(N(3, 1))) too: see CUMSUM_PRECISION."""
    u = torch.rand(shape)
    ld = torch.where(u < 0.33, torch.zeros(shape), -200 - torch.rand(shape) * (1e4 - 200))
    if ordinary:
        ld = torch.where(u > 0.8, F.logsigmoid(torch.randn(shape) + 3.0), ld)
    if len(shape) > 1:
        ld[:, :1] = 0.0
        ld[:, -3:] = 0.0
        ld[:, 5:9] = -1e4
    return ld


# Found while writing these tests (a core issue, since fixed): ordinary log decays that follow a
# step of -1e4 inside a chunk lose precision. The chunk path forms relative decays exp(b_i - b_j) from cumulative
# sums b in float32; after a -1e4 step |b| ~ 1e4, whose float32 spacing is ~1e-3, so b_i - b_j of an ordinary
# span (e.g. -0.3) is off by ~1e-3 and the result by ~1e-3 relative (o: 2e-4 .. 1e-3, gradients up to 4e-3,
# torch and triton). Decays that are exactly 0 between extreme steps add nothing to b and stay exact, which is
# why tests/test_core.py::test_extreme_decays_stay_finite passes. Minimal reproducer (o is ~2.4e-4 off, 1.2e-3
# with backend="triton"):
#     q, k, v = (torch.randn(1, 32, 1, 16) for _ in range(3)); ld = torch.full((1, 32, 1), -0.1); ld[:, 1] = -1e4
#     o, _ = ula.linear_attention(q, k, v, ld, chunk_size=16, backend="torch")
#     o_ref, _ = ula.linear_attention(q.double(), k.double(), v.double(), ld.double(), backend="reference")
CUMSUM_PRECISION = ()  # fixed: the core floors log decays at -110 (ula/core/autograd.py), so these pass at 1e-4
# With ordinary decays mixed in, still finite and within this bound (the loss above is ~1e-3 relative)
MIXED_TOL = 5e-2  # gradients of a constant decay (a sum over B and T) measured up to 2.1e-2


def _core(backend, chunk=16):
    return lambda *a, **kw: ula.linear_attention(*a, chunk_size=chunk, backend=backend, **kw)


def _on(inputs):
    return tuple(None if x is None else x.to(DEVICE) for x in inputs)


CORE_CASES = [(kind, rev) for kind in KINDS[1:] for rev in (False, True)]
# "mixed" ran the inputs of "mixed-exact" at MIXED_TOL, a bound the 1e-4 one now implies: dropped (the suite's time)
MIXES = ["extreme", pytest.param("mixed-exact", marks=CUMSUM_PRECISION)]


def _extreme_core_inputs(kind, backend, mix):
    Bn, T, H, K, V = (1, 45, 2, 16, 12) if backend == "triton" else (2, 77, 2, 16, 24)
    q, k, v, _, _, s0 = make_inputs("none", False, Bn, T, H, K, V)
    ordinary = mix != "extreme"
    ld = {"constant": torch.tensor([0.0, -1e4][:H]), "scalar": _extreme_log_decay((Bn, T, H), ordinary),
          "vector": _extreme_log_decay((Bn, T, H, K), ordinary)}[kind]
    rd = _extreme_log_decay((Bn, T, H, V), ordinary)
    return _on((q, k, v, ld, rd, s0))


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("kind,reverse", CORE_CASES, ids=[f"{k}-{'rev' if r else 'fwd'}" for k, r in CORE_CASES])
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=TRITON)])
def test_core_extreme_decays(backend, kind, reverse, mix):
    """mix: "extreme" (0 and -200..-1e4 only), "mixed-exact" (ordinary decays too), both at 1e-4."""
    seed = fresh_seed()
    errs = compare_with_reference(_core(backend), _extreme_core_inputs(kind, backend, mix), reverse=reverse)
    if kind == "constant" and mix == "mixed-exact" and backend == "triton":
        # a constant decay's gradient is one sum over B*T steps whose terms cancel (helpers.constant_decay_error);
        # the Triton path (float32 dQ, dK) reached 1.5e-3 relative once (seed 459660862), before that measure
        # floored the true value at a tenth of the terms: 3e-3 until the GPU measures it
        assert errs.pop("dld") <= 3e-3, seed
    _check(errs, seed, tol=TOL)


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=TRITON)])
def test_core_extreme_decays_varlen(backend, mix):
    seed = fresh_seed()
    cu = torch.tensor([0, 1, 20, 41])  # a one-step sequence too
    q, k, v, _, _, s0 = make_inputs("none", False, 1, 41, 2, 8, 12, N=3)
    ld = _extreme_log_decay((1, 41, 2, 8), mix != "extreme")
    rd = _extreme_log_decay((1, 41, 2, 12), mix != "extreme")
    errs = compare_with_reference(_core(backend), _on((q, k, v, ld, rd, s0)), cu_seqlens=cu.to(DEVICE))
    _check(errs, seed, tol=TOL)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=TRITON)])
def test_core_all_zero(backend, kind):
    """q = k = v = 0. With a zero state everything (outputs, state, gradients) is exactly 0; with a random
    initial state the output is 0 and the state only decays, and the gradients equal the reference."""
    seed = fresh_seed()
    q, k, v, ld, rd, s0 = make_inputs(kind, True, 1, 33, 2, 8, 8)
    q, k, v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for state in (torch.zeros_like(s0), s0):
        errs = compare_with_reference(_core(backend), _on((q, k, v, ld, rd, state)))
        _check(errs, seed, what="zero state" if not state.any() else "random state")
    o, S = ula.linear_attention(*_on((q, k, v, ld, rd)), output_final_state=True, backend=backend, chunk_size=16)
    assert not o.any() and not S.any()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=TRITON)])
def test_core_single_step(backend, kind):
    """T = 1 (one partial chunk) with an initial state, both directions, log decays exactly 0, ordinary, and -1e4."""
    seed = fresh_seed()
    for reverse in (False, True):
        for fill in (0.0, None, -1e4):
            q, k, v, ld, rd, s0 = make_inputs(kind, True, 1, 1, 2, 8, 12)
            if fill is not None:
                ld = None if ld is None else torch.full_like(ld, fill)
                rd = torch.full_like(rd, fill)
            errs = compare_with_reference(_core(backend), _on((q, k, v, ld, rd, s0)), reverse=reverse)
            if fill == -1e4:
                # the decays' true gradients are exactly 0 here (they multiply a state by exp(-1e4) = 0, in float64
                # too); the closed form q⊙dq − k⊙dk then cancels to rounding: not a relative error, just small
                for n in ("dld", "drd"):
                    errs.pop(n, None)
                grads = _grads_of_decays(backend, (q, k, v, ld, rd, s0), reverse)
                assert all(torch.isfinite(g).all() and g.abs().max() <= 1e-4 for g in grads), (seed, reverse, fill)
            _check(errs, seed, what=f"reverse={reverse}, fill={fill}")


def _grads_of_decays(backend, inputs, reverse):
    q, k, v, ld, rd, s0 = (None if x is None else x.detach().clone().requires_grad_() for x in _on(inputs))
    o, S = ula.linear_attention(q, k, v, ld, rd, initial_state=s0, output_final_state=True, reverse=reverse,
                                backend=backend, chunk_size=16)
    ((o * torch.randn_like(o)).sum() + (S * torch.randn_like(S)).sum()).backward()
    return [x.grad for x in (ld, rd) if x is not None]


# ---------------------------------------------------------------- ops

B, T, H, K, V = 2, 37, 2, 8, 6
KW = dict(chunk_size=16, backend="torch", output_final_state=True)


@pytest.mark.parametrize("variant,backend", [("exp", "torch"), ("sig", "torch"),
                                             pytest.param("exp", "triton", marks=TRITON)])
def test_mlstm_input_gate_80(variant, backend):
    """ĩ up to +80 (exp(80) = 5.5e34; exp(ĩ) itself would overflow float32 beyond 88.7) and down to -80, runs of
    +80, f̃ in [-30, 10]. Tolerances as in tests/test_ops_mlstm.py::test_mlstm_extreme_gates: 1e-4, except the
    gradient of f̃ (1e-3): where a forget gate wipes the state its true gradient is ~0 and the core forms it as a
    difference of O(1) float32 sums. Positive q, k keep |nᵀq| away from 0 (see test_ops_mlstm.py::_qk).
    backend="triton": mLSTMexp's gate-scan kernels and the kernels' implicit normalizer column."""
    seed = fresh_seed()
    i = torch.rand(B, T, H) * 160 - 80
    i[:, 3:8] = 80.0
    i[:, -1] = 80.0
    f = torch.rand(B, T, H) * 40 - 30
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    if variant == "exp":
        q, k = q.abs() + 0.1, k.abs() + 0.1
    ref = ref_mlstm_exp if variant == "exp" else ref_mlstm_sig
    inp = dict(q=q, k=k, v=torch.randn(B, T, H, V), i=i, f=f, h0=None)
    kw = dict(KW, backend=backend)
    if backend == "triton":
        inp = {n: None if x is None else x.to(DEVICE) for n, x in inp.items()}
    errs = compare(lambda h0, **a: ula.mlstm(**a, variant=variant, **kw), lambda h0, **a: ref(**a), inp)
    _check({n: e for n, e in errs.items() if n != "df"}, seed)
    _check({"df": errs["df"]}, seed, tol=1e-3)


def test_mlstm_input_gate_80_float64_signed():
    """The same in float64 with signed q, k (the |nᵀq| branch), where the op is exact math: 1e-9."""
    seed = fresh_seed()
    d = torch.float64
    i = (torch.rand(B, T, H, dtype=d) * 160 - 80)
    i[:, 3:8] = 80.0
    inp = dict(q=torch.randn(B, T, H, K, dtype=d), k=torch.randn(B, T, H, K, dtype=d),
               v=torch.randn(B, T, H, V, dtype=d), i=i, f=torch.rand(B, T, H, dtype=d) * 40 - 30,
               h0=(torch.randn(B, H, K, V, dtype=d), torch.randn(B, H, K, dtype=d), torch.randn(B, H, dtype=d)))
    # a float64 initial state keeps the states in float64 (without one they are float32: see the report)
    # m_0's gradient is all below 1e-9 on some draws (every m_0 far under the gates' maxima: 1.7e-12 at seed
    # 1394273674, off by 1.7e-16 there): relative to at least 1e-9
    errs = compare(lambda h0, **a: ula.mlstm(**a, initial_state=h0, **KW), lambda h0, **a: ref_mlstm_exp(**a, h0=h0),
                   inp, floors={"dh02": 1e-9})
    _check({n: e for n, e in errs.items() if n != "dh02"}, seed, tol=1e-9)
    _check({"dh02": errs["dh02"]}, seed, tol=1e-6)  # m_0: reaches h only through log decays, see test_ops_mlstm


def test_mlstm_single_step_gate_80():
    """T = 1 with ĩ = +80 and an initial state (C, n, m): finite, equal to the reference."""
    seed = fresh_seed()
    q, k = torch.rand(B, 1, H, K) + 0.1, torch.rand(B, 1, H, K) + 0.1
    h0 = (torch.randn(B, H, K, V), torch.rand(B, H, K), torch.randn(B, H))
    inp = dict(q=q, k=k, v=torch.randn(B, 1, H, V), i=torch.full((B, 1, H), 80.0), f=torch.randn(B, 1, H), h0=h0)
    errs = compare(lambda h0, **a: ula.mlstm(**a, initial_state=h0, **KW), lambda h0, **a: ref_mlstm_exp(**a, h0=h0),
                   inp)
    # with m_1 = 80 the output is h = v (k·q)/(n·q) up to terms of e^-80: the true gradients of q, k, ĩ, f̃ and of
    # the initial state are ~e^-80 or cancel exactly, so no relative error exists for them (`compare` still
    # asserts that they are finite); the output, the states and dv are compared
    _check({n: e for n, e in errs.items() if n in ("o", "state0", "state1", "state2", "dv")}, seed)


M = 4


def _gsa_ref(h0, g, s=None, scale=None, **x):
    return ref_gsa(s=-torch.expm1(g) if s is None else s, g=g, h0=h0, scale=scale, **x)


@pytest.mark.parametrize("exact", [False, pytest.param(True, marks=CUMSUM_PRECISION)], ids=["bounded", "exact"])
def test_gsa_gate_logits_1e4(exact):
    """Forget-gate logits ±1e4: α = σ(±1e4) is exactly 1 or exp(-1e4) = 0, i.e. g = logσ(·) is 0 or -1e4 (slots
    that never forget / are overwritten every step), with the paper's tied write strength s = 1 − α in {0, 1}."""
    seed = fresh_seed()
    logits = torch.randn(B, T, H, M).sign() * 1e4 * (torch.rand(B, T, H, M) < 0.8) + torch.randn(B, T, H, M)
    g = F.logsigmoid(logits)
    inp = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V), g=g,
               h0=(torch.randn(B, H, K, M), torch.randn(B, H, M, V)))
    errs = compare(lambda h0, **a: ula.gsa(**a, initial_state=h0, **KW), _gsa_ref, inp)
    # the gates that are not ±1e4 are ordinary decays following -1e4 steps: CUMSUM_PRECISION (measured ~1e-3)
    _check(errs, seed, tol=TOL if exact else MIXED_TOL)


def test_gsa_softmax_logits_1e4():
    """Slot-read logits scale·K̃q of magnitude ~1e4 (scale = 2000): the softmax is one-hot up to exp(-gap).
    Tolerance 1e-3: a logit of size L carries a float32 absolute error ~L·2^-24·sqrt(K) ~ 1e-3, and where two slots
    nearly tie (gap of a few units, a few rows per run) the softmax moves by that much; elsewhere the result is
    exact (one-hot)."""
    seed = fresh_seed()
    g = F.logsigmoid(torch.randn(B, T, H, M) + 2.0)
    inp = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V), g=g, h0=None,
               scale=2000.0)
    o1 = torch.einsum("bthk,bthk->bth", inp["q"], inp["k"])  # sanity: the logits reach ~1e3..1e4
    assert o1.abs().max() * 2000 > 1e4
    errs = compare(lambda h0, scale, **a: ula.gsa(**a, scale=scale, **KW), _gsa_ref, inp)
    # gradients through the softmax (q, k, g) are p(1 - p)·2000 at near-ties, where the float32 logit error moves p
    # itself: ill-conditioned (measured dq 0.1 relative), so only their finiteness (asserted by `compare`) counts
    _check({n: e for n, e in errs.items() if n in ("o", "state0", "state1", "dv")}, seed, tol=1e-3)


def _ref_abc_logspace(q, k, v, w, scale=None, h0=None):
    """ABC with the cumulative softmax in log space (float64): ref_abc keeps Σ exp(w), which overflows float64
    for w = 1e4 (exp(710) = inf)."""
    phi = (w - torch.logcumsumexp(w, 1)).exp()
    return ref_gsa(q, k, v, phi, None, scale, None)


# Found while writing these tests (an op issue, reported): abc forms φ = exp(w - logcumsumexp(w)) in float32, so
# for |w| ~ 1e4 the running log-normalizer (1e4 + log n) is rounded to the float32 spacing at 1e4 (~1e-3) and φ
# is ~5e-4 off relative (o ~1e-4, dw ~7e-4), although w = ±1e4 are exact float32 inputs. Doing the scan of
# _cumulative_softmax in float64 (tensors of [B, T, H, m] only) would fix it.
ABC_PRECISION = ()  # fixed: ula/ops/gsa.py runs the log-normalizer scan in float64


def _abc_on_device(backend, **kw):
    """ula.abc on helpers.DEVICE (the GPU under ULA_TEST_GPU=1), its outputs back on the CPU: compare's float64
    reference and leaves stay there, the gradients flow through the copies."""
    def call(h0, **a):
        o, S = ula.abc(**{n: x.to(DEVICE) for n, x in a.items()}, **dict(KW, backend=backend),
                       **{n: x.to(DEVICE) for n, x in kw.items()})
        return o.cpu(), tuple(x.cpu() for x in S)
    return call


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("exact", [False, pytest.param(True, marks=ABC_PRECISION)], ids=["bounded", "exact"])
def test_abc_slot_logits_1e4(exact, backend):
    """ABC slot logits w in ±1e4 (and 0): φ_t = exp(w_t) / Σ_{j<=t} exp(w_j) is 0, 1 or in between; finite, and
    within 1e-2 of the float64 reference ("bounded"); at 1e-4 ("exact") it needs the fix above."""
    seed = fresh_seed()
    w = torch.randint(-1, 2, (B, T, H, M)).float() * 1e4
    inp = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V), w=w, h0=None)
    errs = compare(_abc_on_device(backend), lambda h0, **a: _ref_abc_logspace(**a), inp)
    _check(errs, seed, tol=TOL if exact else 1e-2)



@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_abc_packed_slot_logits_1e4(backend):
    """Packed ABC, on PyTorch one scan over all tokens, each sequence's logits raised by its index times a margin
    above their spread (ula/ops/gsa.py: no padding, no read of cu_seqlens' values), on Triton its own kernels: with
    logits in ±1e4 and 12 sequences of 1-14 steps, each sequence's φ is its own cumulative softmax, within 1e-4 of
    the float64 reference run per sequence (outputs, states and gradients)."""
    seed = fresh_seed()
    lens = torch.randint(1, 15, (12,))
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    Tn = int(cu[-1])
    w = torch.randint(-1, 2, (1, Tn, H, M)).float() * 1e4
    inp = dict(q=torch.randn(1, Tn, H, K), k=torch.randn(1, Tn, H, K), v=torch.randn(1, Tn, H, V), w=w, h0=None)
    errs = compare(_abc_on_device(backend, cu_seqlens=cu),
                   lambda h0, **a: per_sequence(lambda h0, **y: _ref_abc_logspace(**y), cu, a, {}, h0), inp)
    _check(errs, seed)

OPS_ZERO = {
    "gla": (lambda **a: ula.gla(**a, **KW), dict(g=F.logsigmoid(torch.randn(B, T, H, K) + 2))),
    "mlstm_exp": (lambda **a: ula.mlstm(**a, variant="exp", **KW), dict(i=torch.randn(B, T, H), f=torch.randn(B, T, H))),
    "mlstm_sig": (lambda **a: ula.mlstm(**a, variant="sig", **KW), dict(i=torch.randn(B, T, H), f=torch.randn(B, T, H))),
    "normalized": (lambda **a: ula.normalized_linear_attention(**a, **KW), {}),
    "gsa": (lambda **a: ula.gsa(**a, **KW), dict(g=F.logsigmoid(torch.randn(B, T, H, M) + 2))),
    "abc": (lambda **a: ula.abc(**a, **KW), dict(w=torch.randn(B, T, H, M))),
    "linear_attn": (lambda **a: ula.linear_attn(**a, **KW), {}),
    "retention": (lambda **a: ula.retention(**a, **KW), {}),
    "mamba2": (lambda **a: ula.mamba2(**a, **KW), dict(dt=F.softplus(torch.randn(B, T, H)), A=-torch.rand(H))),
}


# the ops with kernels of their own on the Triton backend (L2 norm and epilogue; gate scan), run there too
ZERO_CASES = [(n, "torch") for n in sorted(OPS_ZERO)] + [pytest.param(n, "triton", marks=TRITON)
                                                        for n in ("mlstm_exp", "normalized")]


@pytest.mark.parametrize("T1", [False, True], ids=["T37", "T1"])
@pytest.mark.parametrize("name,backend", ZERO_CASES)
def test_ops_all_zero_qkv(name, backend, T1):
    """q = k = v = 0 (gates random): outputs, states and all gradients finite; outputs exactly 0. (Normalized
    attention with L2 norm: F.normalize maps 0 to 0, the denominator is a·count > 0, so o = 0 too.)"""
    fresh_seed()
    Tn = 1 if T1 else T
    fn, gates = OPS_ZERO[name]
    if backend == "triton":
        kw = dict(KW, backend="triton")
        fn = {"mlstm_exp": lambda **a: ula.mlstm(**a, variant="exp", **kw),
              "normalized": lambda **a: ula.normalized_linear_attention(**a, **kw)}[name]
    leaves = dict(q=torch.zeros(B, Tn, H, K), k=torch.zeros(B, Tn, H, K), v=torch.zeros(B, Tn, H, V),
                  **{n: x[:, :Tn] if x.dim() >= 3 else x for n, x in gates.items()})
    leaves = {n: x.to(DEVICE if backend == "triton" else "cpu").clone().requires_grad_() for n, x in leaves.items()}
    o, S = fn(**leaves)
    assert torch.isfinite(o).all() and not o.any(), name
    parts = [S] if isinstance(S, torch.Tensor) else list(S)
    assert all(torch.isfinite(p).all() for p in parts), name
    loss = (o * torch.randn_like(o)).sum() + sum((p * torch.randn_like(p)).sum() for p in parts)
    loss.backward()
    for n, x in leaves.items():
        assert x.grad is not None and torch.isfinite(x.grad).all(), f"{name}: gradient of {n}"


def test_op_single_step_mlstm_gsa_against_reference():
    """T = 1 through the ops with initial states, against the references."""
    seed = fresh_seed()
    inp = dict(q=torch.randn(B, 1, H, K), k=torch.randn(B, 1, H, K), v=torch.randn(B, 1, H, V),
               g=F.logsigmoid(torch.randn(B, 1, H, M) + 2), h0=(torch.randn(B, H, K, M), torch.randn(B, H, M, V)))
    _check(compare(lambda h0, **a: ula.gsa(**a, initial_state=h0, **KW), _gsa_ref, inp), seed)
    inp = dict(q=torch.randn(B, 1, H, K), k=torch.randn(B, 1, H, K), v=torch.randn(B, 1, H, V),
               i=torch.randn(B, 1, H), f=torch.randn(B, 1, H), h0=torch.randn(B, H, K, V))
    _check(compare(lambda h0, **a: ula.mlstm(**a, variant="sig", initial_state=h0, **KW),
                   lambda h0, **a: ref_mlstm_sig(**a, h0=h0), inp), seed)


@pytest.mark.parametrize("chunk", [64, 1024])
def test_strong_then_mild_scalar_decays_at_any_chunk(chunk):
    """Per-step log decays near -30 for half a chunk, then mild ones (mLSTMexp under its strongest forget gates):
    the in-chunk cumulative sums reach ~-15000 and the exponents are differences of them. The PyTorch path sums them
    in float64 (ula/core/chunk_torch.py `_cumsum_chunks`); in float32 the output was 4e-4 from float64 at chunk
    1024 (1.6e-7 at 64), and now 1.6e-7 at both. Output and the q, k, v gradients to 1e-5."""
    seed = fresh_seed()
    B, T, H, K = 1, 1024, 2, 32
    q, k, v = (torch.randn(B, T, H, K) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H) * 0.5 + 4)
    g[:, :T // 2] = -30.0 + torch.rand(B, T // 2, H)
    do = torch.randn(B, T, H, K)
    outs = {}
    for dt in (torch.float32, torch.float64):
        xs = [x.detach().to(dt).requires_grad_() for x in (q, k, v)]
        o, _ = ula.linear_attention(*xs, g.to(dt), backend="torch", chunk_size=chunk)
        (o * do.to(dt)).sum().backward()
        outs[dt] = [o] + [x.grad for x in xs]
    errs = {n: rel(a, b) for n, a, b in zip(("o", "dq", "dk", "dv"), outs[torch.float32], outs[torch.float64])}
    _check(errs, seed, tol=1e-5)
