"""cu_seqlens of one sequence over B = 1 ([0, T]) is the plain call (ula.core.api.one_sequence_as_batch): every op
takes the non-varlen kernels there (the ones the splits along T serve at B = 1), and returns, with its final state
and every gradient, what its float64 reference recurrence returns for that sequence."""
import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import compare_with_reference, fresh_seed, make_inputs, record_launches
from test_ops_refs import check, check_conditioned, compare, ref_gla, ref_gsa, ref_mlstm_exp, ref_mlstm_sig, \
    ref_normalized

pytest.importorskip("triton")

B, T, H, K, V, M = 1, 45, 2, 16, 16, 8
CU = torch.tensor([0, T], dtype=torch.int32)
KW = dict(cu_seqlens=CU, chunk_size=16, backend="triton", output_final_state=True)


def _qkv(positive=False):
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    return dict(q=q.abs() + 0.1, k=k.abs() + 0.1, v=v) if positive else dict(q=q, k=k, v=v)


def _gates():
    return dict(i=torch.randn(B, T, H) * 3, f=torch.randn(B, T, H) * 2 + 2)


def _core(reverse):
    def errors():
        inputs = make_inputs("vector", True, 1, T, H, K, V, N=1)  # states [N = 1, H, K, V] in and out
        return compare_with_reference(lambda *a, **kw: ula.linear_attention(*a, **dict(KW, **kw)), inputs,
                                      reverse=reverse)
    return errors


# name -> () -> {name: relative error against the float64 reference}; normalized's (errors, float32 recurrence's)
OPS = {
    "core-fwd": _core(False),
    "core-rev": _core(True),
    "normalized": lambda: compare(lambda **x: ula.normalized_linear_attention(**x, **KW), ref_normalized,
                                  dict(_qkv(), a=1.0, b=1.0), ref_float32=True),
    "mlstm_exp": lambda: compare(lambda **x: ula.mlstm(**x, variant="exp", **KW), ref_mlstm_exp,
                                 dict(_qkv(positive=True), **_gates())),
    "mlstm_sig": lambda: compare(lambda **x: ula.mlstm(**x, variant="sig", **KW), ref_mlstm_sig,
                                 dict(_qkv(), **_gates())),
    "gla": lambda: compare(lambda **x: ula.gla(**x, **KW), ref_gla,
                           dict(_qkv(), g=F.logsigmoid(torch.randn(B, T, H, K) + 3))),
    "gsa": lambda: compare(lambda **x: ula.gsa(**x, **KW), ref_gsa,
                           dict(_qkv(), s=torch.randn(B, T, H, M), g=F.logsigmoid(torch.randn(B, T, H, M) + 3))),
}


@pytest.mark.parametrize("name", list(OPS))
def test_one_sequence_takes_the_plain_kernels(name, monkeypatch):
    """No launch with a varlen layout; outputs, final states and gradients against the float64 reference."""
    seed = fresh_seed()
    varlen = record_launches(monkeypatch, lambda kernel, w, cx, s: cx.get("VARLEN"))
    errs = OPS[name]()
    assert varlen and not any(varlen), (name, varlen)
    if name == "normalized":  # a and b's gradients sum over every step: held against float32's own error
        check_conditioned(*errs, f"seed {seed}")
    else:
        check(errs, seed)


def test_two_sequences_stay_varlen(monkeypatch):
    varlen = record_launches(monkeypatch, lambda kernel, w, cx, s: cx.get("VARLEN"))
    q, k, v = _qkv().values()
    ula.linear_attention(q, k, v, **dict(KW, cu_seqlens=torch.tensor([0, 20, T], dtype=torch.int32)))
    assert any(varlen)
