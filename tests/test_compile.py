"""The core op is a torch.library custom op: a model calling it traces with torch.compile(fullgraph=True)
(no graph break) and gives the eager numbers, forward and gradients."""
import pytest
import torch

import ula
from ula.core import backends
from helpers import KINDS, make_inputs, rel


@pytest.mark.parametrize("kind", KINDS)
def test_fullgraph_compile_matches_eager(kind):
    q, k, v, ld, rd, s0 = make_inputs(kind, kind == "vector", 1, 40, 2, 16, 8)
    cu = torch.tensor([0, 13, 40]) if kind == "scalar" else None
    if cu is not None:
        s0 = torch.randn(2, 2, 16, 8)

    def model(q, k, v, ld, rd, s0):
        o, S = ula.linear_attention(q * 2, k, v, ld, rd, initial_state=s0, output_final_state=True, chunk_size=16,
                                    cu_seqlens=cu)
        return (o.sin().sum() + S.square().sum())

    leaves = [x for x in (q, k, v, ld, rd, s0) if x is not None]
    results = []
    for fn in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        args = [None if x is None else x.detach().clone().requires_grad_() for x in (q, k, v, ld, rd, s0)]
        loss = fn(*args)
        loss.backward()
        results.append([loss] + [a.grad for a in args if a is not None])
    assert len(results[1]) == len(leaves) + 1
    for a, b in zip(*results):
        assert rel(b, a) < 1e-6


def test_op_is_registered():
    assert hasattr(torch.ops.ula, "linear_attention_fwd") and hasattr(torch.ops.ula, "linear_attention_bwd")


def test_trace_of_the_triton_path_only_reads_the_triton_check(monkeypatch):
    """Which path runs is decided by a check of the installed Triton (ula/core/backends.py), found at import: torch
    2.11's Dynamo cannot trace it (`re`), so a trace of the Triton path must read its answer, not run it."""
    real = backends._version

    def untraceable(text):
        if torch.compiler.is_compiling():
            raise RuntimeError("the Triton check was traced")
        return real(text)
    monkeypatch.setattr(backends, "_version", untraceable)
    q, k, v, ld, _, _ = make_inputs("scalar", False, 1, 40, 2, 16, 8)

    def model(q, k, v, ld):
        return ula.linear_attention(q, k, v, ld, backend="triton")[0]  # no chunk_size: the trace picks one
    torch._dynamo.reset()
    assert rel(torch.compile(model, fullgraph=True, backend="aot_eager")(q, k, v, ld), model(q, k, v, ld)) < 1e-6


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_packed_mlstm_exp_traces_fullgraph(backend):
    """Packed mLSTMexp (its gate scan runs per sequence on a padded layout) traces with fullgraph=True, cu_seqlens a
    graph input whose boundaries change between calls: a trace cannot read them, so each row is padded to T steps
    there (ula/ops/_common.py); outputs, final states and gradients as eager."""
    q, k, v = (torch.randn(1, 40, 2, 16, requires_grad=True) for _ in range(3))
    i, f = (torch.randn(1, 40, 2, requires_grad=True) for _ in range(2))

    def model(q, k, v, i, f, cu):
        h, (C, n, m) = ula.mlstm(q, k, v, i, f + 3, backend=backend, cu_seqlens=cu, output_final_state=True)
        return h.square().mean() + C.sum() + n.sum() + m.sum()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for bounds in ([0, 13, 40], [0, 30, 40], [0, 5, 22, 40]):
        cu = torch.tensor(bounds)
        results = []
        for fn in (model, compiled):
            for x in (q, k, v, i, f):
                x.grad = None
            loss = fn(q, k, v, i, f, cu)
            loss.backward()
            results.append([loss] + [x.grad.clone() for x in (q, k, v, i, f)])
        for a, b in zip(*results):
            assert rel(b, a) < 1e-5, bounds
