"""Fixes of an audit of the ops: float64 gradients of a constant decay on the Triton backend, mLSTM gate values
checked under the user's names, and the device of every tensor a family op or *_step takes (the meta device
stands in for another device)."""
import os

import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import DEVICE
import ula.ops._checks as op_checks

B, T, H, K, V, M = 1, 8, 2, 16, 16, 4
NAN, INF = float("nan"), float("inf")


def _meta(x):
    return x.to("meta")


# --- 1. float64 inputs keep float64 gradients with a learnable constant decay on the Triton backend

@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton kernels need CUDA or the interpreter")
def test_triton_float64_constant_decay_gradients():
    pytest.importorskip("triton")
    dev = DEVICE
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 40, H, D, generator=g, dtype=torch.float64) for D in (K, K, V))
    ld = -torch.rand(H, generator=g, dtype=torch.float64) * 0.3
    w = torch.randn(1, 40, H, V, generator=g, dtype=torch.float64)

    def grads(backend):
        xs = [x.to(dev).clone().requires_grad_() for x in (q, k, v, ld)]
        o, _ = ula.linear_attention(*xs, backend=backend)
        (o * w.to(dev)).sum().backward()
        return [x.grad for x in xs]

    for name, got, want in zip(("dq", "dk", "dv", "dld"), grads("triton"), grads("reference")):
        assert got.dtype == torch.float64, name
        err = ((got - want).abs().max() / want.abs().max()).item()
        assert err <= 1e-10, f"{name}: relative error {err:.1e} (float32 precision would be ~1e-7)"


# --- 2. mLSTM: non-finite gates and max state reported under the user's names, with the user's index

def _mlstm_args():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for D in (K, K, V))
    i, f = torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)
    return q, k, v, i, f


def _at(x, idx, val):
    x = x.clone()
    x[idx] = val
    return x


@pytest.mark.parametrize("variant", ["exp", "sig"])
@pytest.mark.parametrize("name", ["i", "f"])
@pytest.mark.parametrize("val", [NAN, INF, -INF])
def test_mlstm_nonfinite_gate(variant, name, val):
    q, k, v, i, f = _mlstm_args()
    gates = {"i": i, "f": f}
    gates[name] = _at(gates[name], (0, 3, 1), val)
    with pytest.raises(ValueError) as e:
        ula.mlstm(q, k, v, gates["i"], gates["f"], variant, backend="torch")
    msg = str(e.value)
    assert f"mlstm: {name} " in msg and "finite" in msg and "(0, 3, 1)" in msg, msg


@pytest.mark.parametrize("val", [NAN, INF, -INF])
def test_mlstm_nonfinite_max_state(val):
    q, k, v, i, f = _mlstm_args()
    m0 = _at(torch.zeros(B, H), (0, 1), val)
    state = (torch.zeros(B, H, K, V), torch.zeros(B, H, K), m0)
    with pytest.raises(ValueError) as e:
        ula.mlstm(q, k, v, i, f, "exp", initial_state=state, backend="torch")
    msg = str(e.value)
    assert "mlstm: state[2] (m)" in msg and "finite" in msg and "(0, 1)" in msg, msg


@pytest.mark.parametrize("variant", ["exp", "sig"])
def test_mlstm_extreme_finite_gates_run(variant):
    """Gates as large as the docs promise (i up to +60, f down to -30) are no errors."""
    q, k, v, i, f = _mlstm_args()
    i, f = torch.full_like(i, 60.0), torch.full_like(f, -30.0)
    i[:, ::2] = -60.0
    h, S = ula.mlstm(q, k, v, i, f, variant, backend="torch", output_final_state=True)
    assert torch.isfinite(h).all()
    h2, _ = ula.mlstm_step(q[:, 0], k[:, 0], v[:, 0], i[:, 0], f[:, 0], S, variant)
    assert torch.isfinite(h2).all()


def test_mlstm_value_checks_follow_the_policy(monkeypatch):
    """The gates' values are read only where the core reads values (ula.core.checks.check_values): not on
    the meta device (a GPU's stand-in) unless value checks are switched on."""
    asked = []
    real = op_checks.check_values
    monkeypatch.setattr(op_checks, "check_values", lambda x: asked.append(tuple(x.shape)) or real(x))
    q, k, v, i, f = (_meta(x) for x in _mlstm_args())
    state = tuple(torch.zeros(s, device="meta") for s in ((B, H, K, V), (B, H, K), (B, H)))
    h, _ = ula.mlstm(q, k, v, i, f, "exp", initial_state=state, backend="torch")
    assert h.device.type == "meta"
    assert asked.count((B, T, H)) == 2 and (B, H) in asked, asked
    try:
        ula.set_value_checks(True)
        with pytest.raises(RuntimeError, match="meta"):  # now it does read them
            ula.mlstm(q, k, v, i, f, "exp", initial_state=state, backend="torch")
    finally:
        ula.set_value_checks(False)


# --- 3. every tensor a family op or *_step takes must be on the device of q

def _seq():
    g = torch.Generator().manual_seed(2)
    return {n: torch.randn(B, T, H, D, generator=g) for n, D in (("q", K), ("k", K), ("v", V))}


def _tok():
    g = torch.Generator().manual_seed(3)
    return {n: torch.randn(B, H, D, generator=g) for n, D in (("q", K), ("k", K), ("v", V))}


def _lg(*shape):
    return F.logsigmoid(torch.randn(*shape))


def _mlstm_state(*lead):
    return (torch.zeros(*lead, H, K, V), torch.zeros(*lead, H, K), torch.zeros(*lead, H))


# (function, good arguments, argument put on the meta device, its name in the message, index in a state tuple)
DEVICE_CASES = [
    ("gla", lambda: dict(_seq(), g=_lg(B, T, H, K)), "g", "g", None),
    ("gla_step", lambda: dict(_tok(), g=_lg(B, H, K)), "g", "g", None),
    ("gla_step", lambda: dict(_tok(), g=_lg(B, H, K), state=torch.zeros(B, H, K, V)), "state", "state", None),
    ("mlstm", lambda: dict(_seq(), i=torch.randn(B, T, H), f=torch.randn(B, T, H)), "i", "i", None),
    ("mlstm", lambda: dict(_seq(), i=torch.randn(B, T, H), f=torch.randn(B, T, H), variant="sig"), "f", "f", None),
    ("mlstm", lambda: dict(_seq(), i=torch.randn(B, T, H), f=torch.randn(B, T, H), initial_state=_mlstm_state(B)),
     "initial_state", "state[2] (m)", 2),
    ("mlstm_step", lambda: dict(_tok(), i=torch.randn(B, H), f=torch.randn(B, H)), "f", "f", None),
    ("mlstm_step", lambda: dict(_tok(), i=torch.randn(B, H), f=torch.randn(B, H), state=_mlstm_state(B)),
     "state", "state[0] (C)", 0),
    ("normalized_linear_attention", lambda: dict(_seq(), a=torch.ones(H)), "a", "a", None),
    ("normalized_linear_attention", lambda: dict(_seq(), b=torch.tensor(0.5)), "b", "b", None),
    ("normalized_linear_attention", lambda: dict(_seq(), initial_state=torch.zeros(B, H, K + 1, V + 1)),
     "initial_state", "initial_state", None),
    ("normalized_linear_attention_step", lambda: dict(_tok(), b=torch.ones(H)), "b", "b", None),
    ("normalized_linear_attention_step", lambda: dict(_tok(), state=torch.zeros(B, H, K + 1, V + 1)), "state",
     "state", None),
    ("gsa", lambda: dict(_seq(), s=torch.rand(B, T, H, M), g=_lg(B, T, H, M)), "s", "s", None),
    ("gsa", lambda: dict(_seq(), g=_lg(B, T, H, M)), "g", "g", None),
    ("gsa", lambda: dict(_seq(), g=_lg(B, T, H, M), initial_state=(torch.zeros(B, H, K, M), torch.zeros(B, H, M, V))),
     "initial_state", "state[1]", 1),
    ("gsa_step", lambda: dict(_tok(), s=torch.rand(B, H, M)), "s", "s", None),
    ("abc", lambda: dict(_seq(), w=torch.randn(B, T, H, M)), "w", "w", None),
    ("abc_step", lambda: dict(_tok(), w=torch.randn(B, H, M)), "w", "w", None),
    ("linear_attn_step", lambda: _tok(), "k", "k", None),
    ("linear_attn_step", lambda: _tok(), "v", "v", None),
    ("linear_attn_step", lambda: dict(_tok(), state=torch.zeros(B, H, K, V)), "state", "state", None),
    ("retention", lambda: dict(_seq(), ld=_lg(H)), "ld", "ld", None),
    ("retention_step", lambda: dict(_tok(), ld=_lg(H)), "ld", "ld", None),
    ("mamba2", lambda: dict(_seq(), dt=torch.rand(B, T, H), A=-torch.rand(H)), "dt", "dt", None),
    ("mamba2", lambda: dict(_seq(), dt=torch.rand(B, T, H), A=-torch.rand(H)), "A", "A", None),
    ("mamba2_step", lambda: dict(_tok(), dt=torch.rand(B, H), A=-torch.rand(H)), "A", "A", None),
    ("hgrn2", lambda: dict(q=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V), g=_lg(B, T, H, K)), "g", "g", None),
    ("hgrn2_step", lambda: dict(q=torch.randn(B, H, K), v=torch.randn(B, H, V), g=_lg(B, H, K)), "g", "g", None),
    ("recurrent_step", lambda: dict(_tok(), ld=_lg(B, H, K)), "ld", "ld", None),
    ("recurrent_step", lambda: dict(_tok(), rd=_lg(B, H, V)), "rd", "rd", None),
]


@pytest.mark.parametrize("fn, good, arg, named, part", DEVICE_CASES,
                         ids=[f"{c[0]}-{c[3]}" for c in DEVICE_CASES])
def test_argument_on_another_device(fn, good, arg, named, part):
    kw = good()
    if part is None:
        kw[arg] = _meta(kw[arg])
    else:
        kw[arg] = tuple(_meta(x) if j == part else x for j, x in enumerate(kw[arg]))
    with pytest.raises(ValueError) as e:
        getattr(ula, fn)(**kw)
    msg = str(e.value)
    assert msg.startswith(f"{fn}: {named}") and "must be on the device of q (cpu), got meta" in msg, msg


def test_normalized_takes_a_cpu_scalar_tensor():
    """A 0-d CPU a / b is moved to q's device (as torch takes CPU scalars); here q is on the CPU too, so the call
    just runs and matches the float a / b."""
    kw = _seq()
    o, _ = ula.normalized_linear_attention(**kw, a=torch.tensor(2.0), b=torch.tensor(0.5), backend="torch")
    ref, _ = ula.normalized_linear_attention(**kw, a=2.0, b=0.5, backend="torch")
    torch.testing.assert_close(o, ref)
