"""Normalized linear attention (paper 001) and GSA / ABC (paper 004) against float64 step-by-step
references: forward, gradients (a, b, the gates g and write strengths s included), states, varlen, decoding."""
import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import emulated_bf16_errors, fresh_seed, rel
from test_ops_refs import (CHUNK, SHAPE, check, check_conditioned, compare, per_sequence, rand_cu, ref_abc, ref_gsa,
                           ref_normalized)

B, T, H, K, V = (SHAPE[x] for x in "BTHKV")
M = 5  # slots
KW = dict(chunk_size=CHUNK, backend="torch")


def _norm_state(N):
    """A state that a prefix could have left: Σ [k; 1][v; 1]ᵀ over 6 random tokens (L2-normalized keys)."""
    k = F.normalize(torch.randn(N, 6, H, K), dim=-1)
    v = torch.randn(N, 6, H, V)
    ka = torch.cat([k, torch.ones_like(k[..., :1])], -1)
    va = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    return torch.einsum("nthk,nthv->nhkv", ka, va)


def normalized_inputs(coef, h0):
    """test_normalized's draw (also benchmarks/cpu_normalized_da_error.py's): coefficients a, b of kind `coef`, then
    q, k, v, then with h0 an initial state."""
    if coef == "float":
        a, b = 1.5, 1.0
    elif coef == "a_tensor":  # a learnable per head, b a float (the Triton path's fused form, its L2 norm inside)
        a, b = torch.rand(H) + 1.2, 0.8
    else:  # learnable per-head coefficients, a > |b| keeps the denominator positive
        a, b = torch.rand(H) + 1.2, torch.rand(H) * 2 - 1
    return dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V), a=a, b=b,
                h0=_norm_state(B) if h0 else None)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("coef", ["float", "tensor", "a_tensor"])
@pytest.mark.parametrize("h0", [False, True])
def test_normalized(coef, h0, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    seed = fresh_seed()
    inp = normalized_inputs(coef, h0)
    kw = dict(KW, backend=backend)
    # da and db sum over every step and may cancel: held against the float32 recurrence's own error (the PyTorch path's
    # da up to 3.0e-5 over 600 draws of the tensor cases, benchmarks/cpu_normalized_da_error.py)
    errs, errs32 = compare(lambda h0, **x: ula.normalized_linear_attention(**x, initial_state=h0, output_final_state=True,
                                                                           **kw),
                           lambda **x: ref_normalized(**x), inp, ref_float32=True)
    check_conditioned(errs, errs32, f"seed {seed}")


def test_normalized_torch_path_sums_the_gradient_of_a_in_float64():
    """The PyTorch epilogue's gradient of a tensor a sums dnum · Z over every step and feature; in float32 it missed
    float64 by 1.5e-4 on this draw (a flake of test_normalized), where the float32 recurrence misses by 4.8e-6; summed
    in float64 it misses by 6.9e-6."""
    torch.manual_seed(3802916040)
    inp = normalized_inputs("tensor", True)
    errs = compare(lambda h0, **x: ula.normalized_linear_attention(**x, initial_state=h0, output_final_state=True,
                                                                   **KW),
                   lambda **x: ref_normalized(**x), inp)
    assert errs["da"] <= 2e-5, errs


def test_normalized_matches_eq4_directly_and_without_l2():
    seed = fresh_seed()
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    o, _ = ula.normalized_linear_attention(q, k, v, 2.0, 0.5, **KW)
    o_ref, _ = ref_normalized(q.double(), k.double(), v.double(), 2.0, 0.5, direct=True)
    assert rel(o, o_ref) <= 1e-4, seed
    # without the L2 norm, positive features keep the denominator away from 0 (a, b > 0); da and db sum over every
    # step and may cancel: held against the float32 recurrence's own error (over 200 seeds up to 7e-4 and 4e-3)
    q, k = q.abs(), k.abs()
    errs, errs32 = compare(lambda **x: ula.normalized_linear_attention(**x, qk_l2_norm=False, output_final_state=True,
                                                                       **KW),
                           lambda **x: ref_normalized(**x, qk_l2_norm=False),
                           dict(q=q, k=k, v=v, a=torch.tensor(0.7), b=torch.tensor(0.3)), ref_float32=True)
    check_conditioned(errs, errs32, f"seed {seed}")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_normalized_a_zero_state(backend):
    """a = 0 (the number): the op skips the a part's sums for the output but still returns the whole state
    (its last row, Σ v and the count, is what a later call with a != 0 needs)."""
    seed = fresh_seed()
    q, k = torch.rand(B, T, H, K), torch.rand(B, T, H, K)  # positive features: no denominator near 0
    kw = dict(KW, backend=backend)
    errs = compare(lambda h0, **x: ula.normalized_linear_attention(**x, qk_l2_norm=False, initial_state=h0,
                                                                   output_final_state=True, **kw),
                   lambda **x: ref_normalized(**x, qk_l2_norm=False),
                   dict(q=q, k=k, v=torch.randn(B, T, H, V), a=0.0, b=1.0, h0=_norm_state(B).abs()))
    check(errs, seed)


def test_normalized_norm_in_float32_keeps_input_dtype(monkeypatch):
    """CUDA autocast runs F.normalize in float32 and returns float32 for bfloat16 q, k; the op must not then hand
    the core q, k in float32 beside bfloat16 v (it did: `ula train --mixer normalized` failed on the GPU).
    Emulated here, as CPU autocast keeps the norm in bfloat16."""
    seed = fresh_seed()
    import ula.ops.normalized as mod
    real = F.normalize
    monkeypatch.setattr(mod.F, "normalize", lambda x, dim: real(x.float(), dim=dim))
    q, k, v = (torch.randn(B, T, H, D).bfloat16() for D in (K, K, V))
    o, _ = ula.normalized_linear_attention(q, k, v, 1.5, 1.0, **KW)
    assert o.dtype == torch.bfloat16
    o_ref, _ = ref_normalized(q.double(), k.double(), v.double(), 1.5, 1.0)
    assert rel(o, o_ref) <= 2e-2, seed


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_normalized_rows_under_the_norms_eps(backend):
    """q and k rows whose norm is under the L2 norm's eps (1e-12: zero, and 0.8e-12): x / eps forward, and F.normalize's
    gradient there, without the projection term (the fused path normalizes q inside its output kernel and marks
    such rows by the sign of 1 / |q|)."""
    if backend == "triton":
        pytest.importorskip("triton")
    seed = fresh_seed()
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    under = lambda: F.normalize(torch.randn(K), dim=0) * 8e-13  # noqa: E731  (norm 0.8 eps: x / eps not small)
    q[0, 2] = 0.0
    q[-1, T - 2, 0] = under()
    k[0, 3, 1] = 0.0
    k[-1, 4, 0] = under()
    inp = dict(q=q, k=k, v=torch.randn(B, T, H, V), a=1.5, b=1.0, h0=None)
    kw = dict(KW, backend=backend)
    errs = compare(lambda h0, **x: ula.normalized_linear_attention(**x, initial_state=h0, output_final_state=True, **kw),
                   lambda **x: ref_normalized(**x), inp)
    check(errs, seed)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_normalized_denominator_clamp(backend):
    """a = 0, b = 1 without L2 norm: a denominator that crosses 0 is clamped to ±eps, never inf or NaN (on the
    Triton path the output kernel divides)."""
    q, k, v = torch.randn(1, 40, 1, 4), torch.randn(1, 40, 1, 4), torch.randn(1, 40, 1, 3)
    k[0, 1] = -k[0, 0]  # Σ_{n<=2} q·k_n = 0 exactly at step 2
    q.requires_grad_()
    o, _ = ula.normalized_linear_attention(q, k, v, 0.0, 1.0, qk_l2_norm=False, eps=1e-3, **dict(KW, backend=backend))
    o.sum().backward()
    assert torch.isfinite(o).all() and torch.isfinite(q.grad).all()
    num = (q[0, 1] * k[0, 0]).sum(-1, keepdim=True) * (v[0, 0] - v[0, 1])  # Σ_{n<=2} (q_2·k_n) v_n
    assert (o[0, 1].abs() <= num.detach().abs() / 1e-3 * 1.001 + 1e-3).all()


def test_normalized_varlen_and_step():
    seed = fresh_seed()
    cu = rand_cu()
    Tn, N = int(cu[-1]), len(cu) - 1
    a, b = torch.rand(H) + 1.2, torch.rand(H)
    inp = dict(q=torch.randn(1, Tn, H, K), k=torch.randn(1, Tn, H, K), v=torch.randn(1, Tn, H, V), h0=_norm_state(N))
    errs = compare(lambda h0, **x: ula.normalized_linear_attention(**x, a=a, b=b, initial_state=h0,
                                                                   output_final_state=True, cu_seqlens=cu, **KW),
                   lambda h0, **x: per_sequence(ref_normalized, cu, x, dict(a=a.double(), b=b.double()), h0), inp)
    check(errs, seed)
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    full, _ = ula.normalized_linear_attention(q, k, v, a, b, **KW)
    T0 = 20
    o0, S = ula.normalized_linear_attention(q[:, :T0], k[:, :T0], v[:, :T0], a, b, output_final_state=True, **KW)
    outs = [o0]
    for t in range(T0, T):
        o_t, S = ula.normalized_linear_attention_step(q[:, t], k[:, t], v[:, t], a, b, S)
        outs.append(o_t.unsqueeze(1))
    assert rel(torch.cat(outs, 1), full) <= 1e-5, seed


def _gsa_inputs(Bn, Tn, N, tied, h0):
    g = F.logsigmoid(torch.randn(Bn, Tn, H, M) + 2.0)
    d = dict(q=torch.randn(Bn, Tn, H, K), k=torch.randn(Bn, Tn, H, K), v=torch.randn(Bn, Tn, H, V), g=g)
    if not tied:
        d["s"] = torch.rand(Bn, Tn, H, M)
    d["h0"] = (torch.randn(N, H, K, M), torch.randn(N, H, M, V)) if h0 else None
    return d


def _ref_gsa(h0, g, s=None, **x):
    return ref_gsa(s=-torch.expm1(g) if s is None else s, g=g, h0=h0, **x)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("h0", [False, True])
def test_gsa(tied, h0):
    """tied: the paper's s = 1 − α (gradients reach g twice); else independent write strengths s."""
    seed = fresh_seed()
    errs = compare(lambda h0, **x: ula.gsa(**x, initial_state=h0, output_final_state=True, **KW), _ref_gsa,
                   _gsa_inputs(B, T, B, tied, h0))
    check(errs, seed)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gsa_default_chunks(monkeypatch, backend):
    """No chunk_size and m <= 64 slots: pass 1 at chunk 128, pass 2 at 64 (gsa.SMALL_M_CHUNKS), T a multiple of
    neither, with initial and final states, against the float64 reference."""
    import importlib
    gsa_mod = importlib.import_module("ula.ops.gsa")  # the module (ula.ops.gsa is also the function's name)
    seed = fresh_seed()
    chunks, real = [], gsa_mod.linear_attention
    monkeypatch.setattr(gsa_mod, "linear_attention",
                        lambda *a, **kw: chunks.append(kw["chunk_size"]) or real(*a, **kw))
    errs = compare(lambda h0, **x: ula.gsa(**x, initial_state=h0, output_final_state=True, backend=backend),
                   _ref_gsa, _gsa_inputs(2, 300, 2, False, True))
    assert set(chunks) == {128, 64} and chunks[:2] == [128, 64], chunks
    check(errs, seed)


def test_gsa_varlen():
    seed = fresh_seed()
    cu = rand_cu()
    Tn, N = int(cu[-1]), len(cu) - 1
    inp = _gsa_inputs(1, Tn, N, True, True)
    errs = compare(lambda h0, **x: ula.gsa(**x, initial_state=h0, output_final_state=True, cu_seqlens=cu, **KW),
                   lambda h0, **x: per_sequence(lambda h0, g, **y: _ref_gsa(h0, g, **y), cu, x, {}, h0), inp)
    check(errs, seed)


def test_gsa_bf16_passes_hand_over_float32(monkeypatch):
    """bfloat16 inputs on the Triton kernels: the first pass hands its output to the softmax in float32 (the o the core
    keeps in float32 for its right decay's gradient) and the second pass takes the softmax output in float32
    beside bf16 v (ula/ops/gsa.py, roundings fewer); outputs and gradients against the float64 reference of the
    same values (bf16 storage error only: the interpreter's matmuls run in float32), varlen with initial and final
    states."""
    import importlib
    gsa_mod = importlib.import_module("ula.ops.gsa")  # the module (ula.ops.gsa is also the function's name)
    seed = fresh_seed()
    seen, handed = [], []
    real_run, real_first = gsa_mod.run, gsa_mod._first_pass
    monkeypatch.setattr(gsa_mod, "run", lambda x, k, v, *a: seen.append((x.dtype, v.dtype)) or real_run(x, k, v, *a))

    def first_pass(*a, **kw):
        o1, S1 = real_first(*a, **kw)
        handed.append(o1.dtype)
        return o1, S1

    monkeypatch.setattr(gsa_mod, "_first_pass", first_pass)
    cu = rand_cu()
    Tn, N = int(cu[-1]), len(cu) - 1
    inp = _gsa_inputs(1, Tn, N, False, True)
    for n in ("q", "k", "v", "s"):
        inp[n] = inp[n].bfloat16()
    errs = compare(lambda h0, **x: ula.gsa(**x, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                           chunk_size=CHUNK, backend="triton"),
                   lambda h0, **x: per_sequence(lambda h0, g, **y: _ref_gsa(h0, g, **y), cu, x, {}, h0), inp)
    # pass 1: bf16 q and s; pass 2: float32 p beside bf16 v; o1 handed over in float32
    assert seen == [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)] and handed == [torch.float32], \
        (seen, handed)
    check(errs, seed, tol=2e-2)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_abc(backend):
    """g = None: ABC with the paper's cumulative-softmax write strengths (Eq. 3-4), plain and varlen; on the Triton
    backend its cumulative softmax runs on its own kernels (ula/ops/_abc_softmax_kernels.py)."""
    seed = fresh_seed()
    kw = dict(KW, backend=backend)
    inp = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V),
               w=torch.randn(B, T, H, M) * 2, h0=None)
    errs = compare(lambda h0, **x: ula.abc(**x, output_final_state=True, **kw), lambda **x: ref_abc(**x), inp)
    check(errs, seed)
    cu = rand_cu()
    Tn, N = int(cu[-1]), len(cu) - 1
    inp = dict(q=torch.randn(1, Tn, H, K), k=torch.randn(1, Tn, H, K), v=torch.randn(1, Tn, H, V),
               w=torch.randn(1, Tn, H, M) * 2,
               h0=(torch.randn(N, H, K, M), torch.randn(N, H, M, V), torch.randn(N, H, M)))
    errs = compare(lambda h0, **x: ula.abc(**x, initial_state=h0, output_final_state=True, cu_seqlens=cu, **kw),
                   lambda h0, **x: per_sequence(ref_abc, cu, x, {}, h0), inp)
    check(errs, seed)


@pytest.mark.parametrize("family", ["gsa", "gsa_untied", "abc"])
def test_gsa_step_decoding(family):
    seed = fresh_seed()
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    g = F.logsigmoid(torch.randn(B, T, H, M) + 2.0)
    s = torch.rand(B, T, H, M) if family == "gsa_untied" else None
    w = torch.randn(B, T, H, M)

    def chunk(sl, state, final):
        x = dict(q=q[:, sl], k=k[:, sl], v=v[:, sl])
        if family == "abc":
            return ula.abc(**x, w=w[:, sl], initial_state=state, output_final_state=final, **KW)
        return ula.gsa(**x, s=None if s is None else s[:, sl], g=g[:, sl], initial_state=state,
                       output_final_state=final, **KW)

    def step(t, state):
        if family == "abc":
            return ula.abc_step(q[:, t], k[:, t], v[:, t], w[:, t], state)
        return ula.gsa_step(q[:, t], k[:, t], v[:, t], None if s is None else s[:, t], g[:, t], state)

    full, _ = chunk(slice(0, T), None, False)
    T0 = 19
    o0, state = chunk(slice(0, T0), None, True)
    outs = [o0]
    for t in range(T0, T):
        o_t, state = step(t, state)
        outs.append(o_t.unsqueeze(1))
    assert rel(torch.cat(outs, 1), full) <= 1e-5, seed


def test_gsa_float32_handovers_lower_the_errors():
    """The float32 handovers between GSA's passes with emulated bf16 matmuls and bf16 storage
    (benchmarks/cpu_bf16_error.py --bf16): pass 1's output and its gradient in float32 (the default) against bf16
    (variant o1_bf16 of benchmarks/gpu_gsa_variants.py, before session 14): dq and dk drop (over 12 seeds by 5-11%);
    s in float32, its two gradients summed before one rounding (variant s_wide, off by default for its time) against
    the default: ds drops (17-24%)."""
    import os
    seed = str(int.from_bytes(os.urandom(2), "little"))
    errs = {variant: emulated_bf16_errors("--op", "gsa", "--m", "32", "--bf16", "--shape", "1,160,1,32,32", "--seed",
                                          seed, "--variant", variant, ULA_TF32_TRUNC="1")
            for variant in ("default", "o1_bf16", "s_wide")}
    new, old, wide = errs["default"], errs["o1_bf16"], errs["s_wide"]
    assert new["dq"] < 0.99 * old["dq"] and new["dk"] < 0.99 * old["dk"] and wide["ds"] < 0.9 * new["ds"], \
        (errs, seed)
