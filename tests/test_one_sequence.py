"""cu_seqlens of one sequence over B = 1 ([0, T]) is the plain call (ula.core.api.one_sequence_as_batch): every op
takes the non-varlen kernels there (the ones the splits along T serve at B = 1), and returns what the float64
reference returns for that sequence."""
import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import compare_with_reference, fresh_seed, make_inputs, record_launches, rel

pytest.importorskip("triton")

B, T, H, K, V = 1, 45, 2, 16, 16


def _inputs():
    q, k, v = (torch.randn(B, T, H, D) for D in (K, K, V))
    return q, k * K ** -0.5, v


def _core(cu):
    q, k, v = _inputs()
    ld = F.logsigmoid(torch.randn(B, T, H) + 3)
    return ula.linear_attention(q, k, v, ld, cu_seqlens=cu, chunk_size=16, backend="triton",
                                output_final_state=True)[0]


def _normalized(cu):
    return ula.normalized_linear_attention(*_inputs(), cu_seqlens=cu, chunk_size=16, backend="triton")[0]


def _mlstm(variant):
    def call(cu):
        i, f = torch.randn(B, T, H), torch.randn(B, T, H) + 3
        return ula.mlstm(*_inputs(), i, f, variant=variant, cu_seqlens=cu, chunk_size=16, backend="triton")[0]
    return call


def _gla(cu):
    g = F.logsigmoid(torch.randn(B, T, H, K) + 3)
    return ula.gla(*_inputs(), g, cu_seqlens=cu, chunk_size=16, backend="triton")[0]


def _gsa(cu):
    q, k, v = _inputs()
    s, g = torch.randn(B, T, H, 8), F.logsigmoid(torch.randn(B, T, H, 8) + 3)
    return ula.gsa(q, k, v, s, g, cu_seqlens=cu, chunk_size=16, backend="triton")[0]


OPS = {"core": _core, "normalized": _normalized, "mlstm_exp": _mlstm("exp"), "mlstm_sig": _mlstm("sig"),
       "gla": _gla, "gsa": _gsa}


@pytest.mark.parametrize("name", list(OPS))
def test_one_sequence_takes_the_plain_kernels(name, monkeypatch):
    """No launch with a varlen layout, and the same output as the call without cu_seqlens on the same inputs."""
    seed = fresh_seed()
    varlen = record_launches(monkeypatch, lambda kernel, w, cx, s: cx.get("VARLEN"))
    o = OPS[name](torch.tensor([0, T], dtype=torch.int32))
    launched = len(varlen)
    torch.manual_seed(seed)
    o_plain = OPS[name](None)
    assert launched and not any(varlen), (name, varlen)
    assert rel(o, o_plain) == 0, (name, seed)


def test_two_sequences_stay_varlen(monkeypatch):
    varlen = record_launches(monkeypatch, lambda kernel, w, cx, s: cx.get("VARLEN"))
    _core(torch.tensor([0, 20, T], dtype=torch.int32))
    assert any(varlen)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_one_sequence_against_reference(reverse):
    """States [N = 1, H, K, V] in and out, every gradient, both directions, against the float64 reference run with
    the same cu_seqlens."""
    seed = fresh_seed()
    inputs = make_inputs("vector", True, 1, 37, 2, 16, 24, N=1)
    cu = torch.tensor([0, 37])
    errs = compare_with_reference(lambda *a, **kw: ula.linear_attention(*a, chunk_size=16, backend="triton", **kw),
                                  inputs, cu_seqlens=cu, reverse=reverse)
    bad = {k: e for k, e in errs.items() if not e <= 1e-4}
    assert not bad, (bad, seed)
