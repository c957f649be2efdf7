"""The fused mLSTMexp epilogue (ula/ops/_mlstm_epilogue.py) against autograd through the PyTorch code it replaces
(ula/ops/mlstm.py: `_exp_epilogue_torch`, still the torch backend's): h and the gradients of o, den and m, in
float64 (|m| <= 80: no clamp) and in the Triton path's own dtypes (the float32 clamp of exp(−m)); rows where
exp(−m) or |den| wins the max, exact ties, eps = 0 and 1e-6, blocks of steps cut mid-sequence, strided inputs.
Outputs are poisoned (NaN) before the kernels run (conftest.py), so every comparison also checks that every
element was written."""
import pytest
import torch

pytest.importorskip("triton")

import ula  # noqa: E402
from helpers import fresh_seed  # noqa: E402
from ula.ops import _mlstm_epilogue as epi  # noqa: E402
from ula.ops.mlstm import _denominator, _exp_epilogue_torch  # noqa: E402  (the PyTorch form: the specification)

D64 = torch.float64


def _run(fn, o, den, m, dh, eps, cast=None):
    """(h, do, dden, dm) of fn on leaves made from o, den, m (cast to `cast` if given) and the cotangent dh."""
    leaves = [x.detach().to(cast or x.dtype).requires_grad_() for x in (o, den, m)]
    h = fn(*leaves, eps)
    return (h, *torch.autograd.grad(h, leaves, dh.to(h.dtype)))


def _rows(B, T, H, extreme):
    """den, m [B, T, H] float64, each row one of: generic; exp(−m) wins (m = −5, |den| < 0.01); |den| wins
    (m = 5); an exact tie |den| = exp(−m) = 1 (torch.maximum's even split); den = 0; and with `extreme`
    m = ±80 (exp(−m) ~ 5.5e34 or 1.8e-35) with den generic or 0."""
    den = torch.randn(B, T, H, dtype=D64)
    m = torch.rand(B, T, H, dtype=D64) * 6 - 3
    kind = torch.randint(0, 7 if extreme else 5, (B, T, H))
    m = torch.where(kind == 1, -5.0 + 0.1 * torch.rand_like(m), m)
    den = torch.where(kind == 1, den * 0.003, den)
    m = torch.where(kind == 2, torch.full_like(m, 5.0), m)
    m = torch.where(kind == 3, torch.zeros_like(m), m)
    den = torch.where(kind == 3, torch.sign(den), den)
    den = torch.where(kind == 4, torch.zeros_like(den), den)
    big = torch.where(torch.rand_like(m) < 0.5, 80.0, -80.0)
    m = torch.where(kind >= 5, big, m)
    den = torch.where(kind == 6, torch.zeros_like(den), den)
    return den, m, kind


def _check(got, ref, o, dh, D, eps, tol, seed):
    """got: the kernel's (h, do, dden, dm); ref: float64 autograd through the PyTorch code; D its denominator
    [B, T, H]. Bounds per row, on the scales of the terms: h and do to tol of their row's largest element; dden
    and dm to tol of g's terms (G = Σ |dh o| / D: in float32 g may cancel) times each one's factor (dden 1 / D,
    dm eps / D), dm also to 1e-12 G: float64 autograd forms it as −g / D + g |den| / D², noise ~1e-16 G where
    the kernel gives eps g / D² (0 with eps = 0)."""
    h, do, dden, dm = got
    h_r, do_r, dden_r, dm_r = ref
    for name, a in zip(("h", "do", "dden", "dm"), got):
        assert torch.isfinite(a).all(), (name, seed)  # written everywhere (poisoned buffers), and no overflow
    assert (h.dtype, do.dtype) == (o.dtype, o.dtype)
    for name, a, b in (("h", h, h_r), ("do", do, do_r)):
        scale = b.abs().amax(-1, keepdim=True)
        assert ((a.double() - b).abs() <= tol * scale).all(), (name, seed)
    G = (dh.double() * o.double()).abs().sum(-1) / D
    assert ((dden.double() - dden_r).abs() <= tol * G / D).all(), ("dden", seed)
    assert ((dm.double() - dm_r).abs() <= tol * G * eps / D + 1e-12 * G).all(), ("dm", seed)


SHAPES = [(300, 1, 16), (100, 3, 48), (45, 3, 128)]  # (T, H, V): T over one block of steps and not a multiple


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T, H, V", SHAPES)
def test_epilogue_matches_torch(T, H, V, dtype, eps, one_thread):
    seed = fresh_seed()
    BT = epi._tiles(T, V)[0]
    assert T > BT and T % BT, "the shape should cut a block of steps"
    B = 2
    f32 = dtype == torch.float32
    den, m, kind = _rows(B, T, H, extreme=f32)  # float16 would overflow h = o / 1.8e-35
    o = torch.randn(B, T, H, V, dtype=D64).to(dtype)
    dh = torch.randn(B, T, H, V, dtype=D64).to(dtype)
    got = _run(epi.mlstm_exp_epilogue, o, den.float(), m, dh, eps)  # m float64, as the gate kernel gives it
    ref = _run(_exp_epilogue_torch, o, den.float(), m, dh, eps, cast=D64)
    assert (got[2].dtype, got[3].dtype) == (torch.float32, D64)
    _check(got, ref, o, dh, _denominator(den.float().double(), m, eps), eps, 1e-5 if f32 else 2e-3, seed)
    if eps == 0.0:  # exact: h does not depend on m without eps (and no clamp)
        assert not got[3].any(), seed
    assert all((kind == k).any() for k in range(5)), "each kind of row drawn"


def test_float32_m_and_strided_inputs(one_thread):
    """o and den as slices of one [B, T, H, V + 1] tensor (the core's generic path), m float32 and transposed,
    dh broadcast along B, T, H (stride 0): read through their strides; gradients in the inputs' dtypes."""
    seed = fresh_seed()
    B, T, H, V = 2, 70, 3, 20
    den, m, _ = _rows(B, T, H, extreme=True)
    od = torch.cat([torch.randn(B, T, H, V), den.float().unsqueeze(-1)], -1)
    o, den = od[..., :V], od[..., V]
    mt = m.float().transpose(1, 2).contiguous().transpose(1, 2)
    assert not (o.is_contiguous() or den.is_contiguous() or mt.is_contiguous())
    dh = torch.randn(1, 1, 1, V).expand(B, T, H, V)
    got = _run(epi.mlstm_exp_epilogue, o, den, mt, dh, 1e-6)
    assert [x.dtype for x in got] == [torch.float32] * 4
    ref = _run(_exp_epilogue_torch, o, den, mt, dh, 1e-6, cast=D64)
    _check(got, ref, o, dh, _denominator(den.double(), mt.double(), 1e-6), 1e-6, 1e-5, seed)


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_clamp(eps, one_thread):
    """exp(−m) past the float32 maximum (m <= −89) is clamped to it and passes no gradient to m: there against the
    PyTorch code in the Triton path's dtypes (o, den float32, m float64). Just inside (m = −88.5, D ~ 2.7e38) it
    does, against the float64 code (float32 autograd underflows there: its dm is −g / D instead of 0 at eps = 0)."""
    seed = fresh_seed()
    B, T, H, V = 1, 40, 2, 16
    o, dh = torch.randn(B, T, H, V), torch.randn(B, T, H, V)
    m = torch.tensor([-100.0, -89.0, -88.5, 0.0], dtype=D64)[torch.randint(0, 4, (B, T, H))]
    den = torch.randn(B, T, H)
    got = _run(epi.mlstm_exp_epilogue, o, den, m, dh, eps)
    ref = _run(_exp_epilogue_torch, o, den, m, dh, eps)
    ref64 = _run(_exp_epilogue_torch, o, den, m, dh, eps, cast=D64)
    c = m < -88.8
    assert c.any() and (~c).any(), seed
    _check([x[~c] for x in got], [x[~c] for x in ref64], o[~c], dh[~c], _denominator(den.double(), m, eps)[~c],
           eps, 1e-5, seed)
    got, ref = [x[c] for x in got], [x[c] for x in ref]
    for name, a, b in zip(("h", "do"), got, ref):  # ~3e-39, subnormal: the PyTorch code rounds f / D to 2^-149
        assert ((a - b).abs() <= 1e-5 * b.abs() + 1e-44).all(), (name, seed)
    assert not got[2].any() and not ref[2].any(), seed  # exp(−m) wins the max
    G = (dh[c] * o[c]).abs().sum(-1).double() / torch.finfo(torch.float32).max
    assert ((got[3] - ref[3]).abs() <= 1e-5 * G).all(), seed  # dm = −g / D


def test_no_grad_and_some_grads(one_thread):
    """The forward alone (no_grad) gives the same h; an input without requires_grad gets no gradient."""
    seed = fresh_seed()
    B, T, H, V = 1, 33, 2, 16
    o, den, m = torch.randn(B, T, H, V), torch.randn(B, T, H), torch.randn(B, T, H, dtype=D64)
    with torch.no_grad():
        h0 = epi.mlstm_exp_epilogue(o, den, m, 1e-6)
    ol = o.clone().requires_grad_()
    h = epi.mlstm_exp_epilogue(ol, den, m, 1e-6)
    assert torch.equal(h0, h), seed
    (do,) = torch.autograd.grad(h, ol, torch.ones_like(h))
    assert torch.isfinite(do).all(), seed


@pytest.mark.parametrize("V", [16, 20])
def test_mlstm_uses_the_kernel(V, one_thread, monkeypatch):
    """mlstm(variant="exp") calls the fused epilogue on the Triton backend only (V = 16: the core's fast path,
    V = 20: its generic path, o and den slices), and both backends agree."""
    import ula.ops._mlstm_epilogue as mod
    calls = []
    fused = mod.mlstm_exp_epilogue
    monkeypatch.setattr(mod, "mlstm_exp_epilogue", lambda *a: calls.append(1) or fused(*a))
    seed = fresh_seed()
    B, T, H, K = 2, 29, 2, 16
    q, k = torch.rand(B, T, H, K) + 0.1, torch.rand(B, T, H, K) + 0.1
    inputs = [q, k, torch.randn(B, T, H, V), torch.randn(B, T, H) * 3, torch.randn(B, T, H) * 2 + 2]
    res = []
    for backend, dt in (("triton", torch.float32), ("torch", D64)):
        xs = [x.to(dt).requires_grad_() for x in inputs]
        h, _ = ula.mlstm(*xs, chunk_size=16, backend=backend)
        torch.manual_seed(seed)
        res.append([h, *torch.autograd.grad(h, xs, torch.randn(h.shape).to(dt))])
    assert calls == [1], seed
    for a, b in zip(*res):
        assert ((a.double() - b).norm() <= 1e-4 * b.norm()), seed
