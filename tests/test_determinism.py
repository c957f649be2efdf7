"""Determinism: the same inputs twice give bitwise the same outputs, final states and gradients, for the core
(PyTorch chunk path and the Triton kernels, through the interpreter on CPU) and every family op."""
import os

import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import DEVICE, KINDS, fresh_seed, make_inputs
from test_ops_refs import _flat




def _run(fn, inputs, seed):
    """fn(**leaves) -> (o, state); returns o, state parts and the gradients of every floating input, for
    random cotangents drawn from `seed` (the same both times)."""
    leaves = {n: [x.detach().clone().requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point()
                  else x for x in v] if isinstance(v, tuple) else
              (v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for n, v in inputs.items()}
    args = {n: tuple(v) if isinstance(v, list) else v for n, v in leaves.items()}
    o, S = fn(**args)
    g = torch.Generator().manual_seed(seed)
    outs = [o] + _flat(S)
    loss = sum((y.double() * torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.device)).sum() for y in outs)
    loss.backward()
    grads = [x.grad for x in _flat(list(leaves.values())) if isinstance(x, torch.Tensor) and x.requires_grad]
    return [y.detach() for y in outs] + grads


def _assert_bitwise(fn, inputs, seed):
    a, b = _run(fn, inputs, seed), _run(fn, inputs, seed)
    assert len(a) == len(b)
    for j, (x, y) in enumerate(zip(a, b)):
        assert x is not None and y is not None, f"tensor {j}: missing gradient"
        assert torch.equal(x, y), f"tensor {j} differs between two identical calls (seed {seed}): " \
                                  f"max |diff| {(x.double() - y.double()).abs().max().item():.3e}"


def _core_inputs(kind, varlen):
    if varlen:
        q, k, v, ld, rd, s0 = make_inputs(kind, True, 1, 45, 2, 16, 12, N=3)
        cu = torch.tensor([0, 7, 30, 45])
    else:
        q, k, v, ld, rd, s0 = make_inputs(kind, True, 2, 45, 2, 16, 12)
        cu = None
    return dict(q=q, k=k, v=v, ld=ld, rd=rd, initial_state=s0), cu


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_core_torch(kind, varlen, reverse):
    seed = fresh_seed()
    inp, cu = _core_inputs(kind, varlen)
    _assert_bitwise(lambda **a: ula.linear_attention(**a, output_final_state=True, cu_seqlens=cu, chunk_size=16,
                                                     reverse=reverse, backend="torch"), inp, seed)


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton kernels need CUDA or the interpreter")
@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_core_triton(kind):
    pytest.importorskip("triton")
    seed = fresh_seed()
    q, k, v, ld, rd, s0 = make_inputs(kind, True, 1, 21, 1, 8, 12, N=2)
    dev = DEVICE
    inp = {n: None if x is None else x.to(dev) for n, x in
           dict(q=q, k=k, v=v, ld=ld, rd=rd, initial_state=s0).items()}
    cu = torch.tensor([0, 9, 21], device=dev)
    _assert_bitwise(lambda **a: ula.linear_attention(**a, output_final_state=True, cu_seqlens=cu, chunk_size=16,
                                                     reverse=kind == "vector", backend="triton"), inp, seed)


B, T, H, K, V, M = 2, 37, 2, 8, 6, 4
KW = dict(chunk_size=16, backend="torch", output_final_state=True)


def _qkv():
    return dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V))


def _gate(*shape):
    return F.logsigmoid(torch.randn(*shape) + 2.0)


OPS = {
    "gla": (lambda **a: ula.gla(**a, **KW), lambda: dict(**_qkv(), g=_gate(B, T, H, K),
                                                        initial_state=torch.randn(B, H, K, V))),
    "mlstm_exp": (lambda **a: ula.mlstm(**a, variant="exp", **KW),
                  lambda: dict(**_qkv(), i=torch.randn(B, T, H) * 3, f=torch.randn(B, T, H) + 2,
                               initial_state=(torch.randn(B, H, K, V), torch.randn(B, H, K), torch.randn(B, H)))),
    "mlstm_sig": (lambda **a: ula.mlstm(**a, variant="sig", **KW),
                  lambda: dict(**_qkv(), i=torch.randn(B, T, H), f=torch.randn(B, T, H) + 2)),
    "normalized": (lambda **a: ula.normalized_linear_attention(**a, **KW),
                   lambda: dict(**_qkv(), a=torch.rand(H) + 1.2, b=torch.rand(H))),
    "gsa": (lambda **a: ula.gsa(**a, **KW), lambda: dict(**_qkv(), g=_gate(B, T, H, M),
                                                        initial_state=(torch.randn(B, H, K, M), torch.randn(B, H, M, V)))),
    "abc": (lambda **a: ula.abc(**a, **KW), lambda: dict(**_qkv(), w=torch.randn(B, T, H, M))),
    "linear_attn": (lambda **a: ula.linear_attn(**a, **KW), lambda: dict(**_qkv())),
    "retention": (lambda **a: ula.retention(**a, **KW), lambda: dict(**_qkv(), ld=_gate(H))),
    "mamba2": (lambda **a: ula.mamba2(**a, **KW),
               lambda: dict(**_qkv(), dt=F.softplus(torch.randn(B, T, H)), A=-torch.rand(H) - 0.1)),
    "hgrn2": (lambda **a: ula.hgrn2(**a, **KW), lambda: dict(q=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V),
                                                            g=_gate(B, T, H, K))),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_ops(name):
    seed = fresh_seed()
    fn, make = OPS[name]
    _assert_bitwise(fn, make(), seed)


@pytest.mark.parametrize("name", ["gla", "mlstm_exp", "gsa", "abc"])
def test_ops_varlen(name):
    """Packed sequences (the ops that pad/unpad for their scans: mlstm, abc) are deterministic too."""
    seed = fresh_seed()
    fn, make = OPS[name]
    inp = {n: (x[:1].reshape(1, -1, *x.shape[2:]) if isinstance(x, torch.Tensor) and x.dim() >= 3 and x.shape[:2] == (B, T)
               else x) for n, x in make().items() if n != "initial_state"}
    inp = {n: torch.cat([x, x], 1) if isinstance(x, torch.Tensor) and x.dim() >= 3 and x.shape[0] == 1 else x
           for n, x in inp.items()}
    cu = torch.tensor([0, 5, 2 * T])
    _assert_bitwise(lambda **a: fn(**a, cu_seqlens=cu), inp, seed)
