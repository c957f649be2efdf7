"""GLA and the one-line families of paper 000 Table 2 (plain, RetNet/TNL, Mamba2, HGRN2) against float64
references written from their recurrences: forward, gradients (decays included), states, varlen, decoding."""
import math

import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import fresh_seed, rel
from test_ops_refs import (CHUNK, SHAPE, check, compare, per_sequence, rand_cu, ref_gla, ref_hgrn2, ref_mamba2,
                           ref_plain, ref_retention)

B, T, H, K, V = (SHAPE[x] for x in "BTHKV")
KW = dict(chunk_size=CHUNK, backend="torch")


def _gate(*shape):
    return F.logsigmoid(torch.randn(*shape) + 2.0)


@pytest.mark.parametrize("h0", [False, True])
def test_gla(h0):
    seed = fresh_seed()
    inp = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V), g=_gate(B, T, H, K),
               h0=torch.randn(B, H, K, V) if h0 else None)
    errs = compare(lambda h0, **a: ula.gla(**a, initial_state=h0, output_final_state=True, **KW),
                   lambda g, **a: ref_gla(g=g, **a), inp)
    check(errs, seed)


def test_gla_varlen():
    seed = fresh_seed()
    cu = rand_cu()
    Tn, N = int(cu[-1]), len(cu) - 1
    inp = dict(q=torch.randn(1, Tn, H, K), k=torch.randn(1, Tn, H, K), v=torch.randn(1, Tn, H, V),
               g=_gate(1, Tn, H, K), h0=torch.randn(N, H, K, V))
    errs = compare(lambda h0, **a: ula.gla(**a, initial_state=h0, output_final_state=True, cu_seqlens=cu, **KW),
                   lambda h0, **a: per_sequence(ref_gla, cu, a, {}, h0), inp)
    check(errs, seed)


def test_plain_and_retention():
    seed = fresh_seed()
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    h0 = torch.randn(B, H, K, V)
    errs = compare(lambda h0, **a: ula.linear_attn(**a, initial_state=h0, output_final_state=True, **KW),
                   lambda **a: ref_plain(**a), dict(q=q, k=k, v=v, h0=h0))
    check(errs, seed)
    ld = torch.log(torch.rand(H) * 0.2 + 0.75)
    errs = compare(lambda ld, h0, **a: ula.retention(**a, ld=ld, initial_state=h0, output_final_state=True, **KW),
                   lambda ld, **a: ref_retention(gamma=ld.exp(), **a), dict(q=q, k=k, v=v, ld=ld, h0=h0))
    check(errs, seed)
    # RetNet's default decays γ_h = 1 - 2^(-5-h)
    o, _ = ula.retention(q, k, v, **KW)
    o_ref, _ = ref_retention(q.double(), k.double(), v.double(), 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64)))
    assert rel(o, o_ref) <= 1e-4, seed
    # made on the device (no host copy): the same float32 values as the formula in double on the host
    want = torch.tensor([math.log1p(-2.0 ** (-5 - h)) for h in range(40)], dtype=torch.float32)
    assert torch.equal(ula.retnet_log_decay(40), want)


def test_mamba2():
    seed = fresh_seed()
    inp = dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V),
               dt=F.softplus(torch.randn(B, T, H) - 1), A=-torch.rand(H) * 2 - 0.1, h0=torch.randn(B, H, K, V))
    errs = compare(lambda h0, **a: ula.mamba2(**a, initial_state=h0, output_final_state=True, **KW),
                   lambda q, k, v, **a: ref_mamba2(q, k, v, **a), inp)
    check(errs, seed)


def test_hgrn2_varlen():
    seed = fresh_seed()
    cu = rand_cu()
    Tn, N = int(cu[-1]), len(cu) - 1
    inp = dict(q=torch.randn(1, Tn, H, K), v=torch.randn(1, Tn, H, V), g=_gate(1, Tn, H, K),
               h0=torch.randn(N, H, K, V))
    errs = compare(lambda h0, **a: ula.hgrn2(**a, initial_state=h0, output_final_state=True, cu_seqlens=cu, **KW),
                   lambda h0, **a: per_sequence(ref_hgrn2, cu, a, {}, h0), inp)
    check(errs, seed)


def _decode(chunk_op, step_op, per_token, T0):
    """Prefill T0 tokens with the chunk op, step through the rest; compare with one chunk call."""
    full, _ = chunk_op(**per_token, state=None, final=False)
    o0, state = chunk_op(**{n: x[:, :T0] for n, x in per_token.items()}, state=None, final=True)
    outs = [o0]
    for t in range(T0, T):
        o_t, state = step_op(**{n: x[:, t] for n, x in per_token.items()}, state=state)
        outs.append(o_t.unsqueeze(1))
    return rel(torch.cat(outs, 1), full)


@pytest.mark.parametrize("family", ["gla", "plain", "retention", "mamba2", "hgrn2"])
def test_step_decoding(family):
    seed = fresh_seed()
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    ld = torch.log(torch.rand(H) * 0.2 + 0.75)
    A = -torch.rand(H) - 0.1

    def chunk(fn):
        return lambda state, final, **a: fn(**a, initial_state=state, output_final_state=final, **KW)

    cases = {
        "gla": (chunk(ula.gla), ula.gla_step, dict(q=q, k=k, v=v, g=_gate(B, T, H, K))),
        "plain": (chunk(ula.linear_attn), ula.linear_attn_step, dict(q=q, k=k, v=v)),
        "retention": (chunk(lambda **a: ula.retention(ld=ld, **a)),
                      lambda **a: ula.retention_step(ld=ld, **a), dict(q=q, k=k, v=v)),
        "mamba2": (chunk(lambda **a: ula.mamba2(A=A, **a)), lambda **a: ula.mamba2_step(A=A, **a),
                   dict(q=q, k=k, v=v, dt=F.softplus(torch.randn(B, T, H)))),
        "hgrn2": (chunk(ula.hgrn2), ula.hgrn2_step, dict(q=q, v=v, g=_gate(B, T, H, K))),
    }
    chunk_op, step_op, per_token = cases[family]
    assert _decode(chunk_op, step_op, per_token, T0=21) <= 1e-5, seed


@pytest.mark.parametrize("given,want", [(None, "accurate"), ("fast", "fast"), (("own_block",), ("own_block",))])
def test_gla_precision_default(monkeypatch, given, want):
    """precision=None is GLA's measured default, "accurate" (as None is each op's default elsewhere), not the core's."""
    import sys
    gla_module = sys.modules["ula.ops.gla"]  # the module (ula.ops.gla is the function)
    seen = []
    real = gla_module.linear_attention
    monkeypatch.setattr(gla_module, "linear_attention", lambda *a, **kw: seen.append(kw["precision"]) or real(*a, **kw))
    q = torch.randn(1, 5, 1, 4)
    ula.gla(q, q, q, _gate(1, 5, 1, 4), precision=given)
    assert seen == [want]
