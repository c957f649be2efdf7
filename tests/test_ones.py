"""ula.core.ones: linear attention with an implicit column of ones in v (the normalizer of mLSTMexp and
normalized attention), on the Triton kernels (den from the state's extra vector and the scores' row sums),
against the float64 reference recurrence on [v, 1]: outputs, final states and every gradient."""
import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import fresh_seed, record_launches, rel
from ula.core.ones import linear_attention_with_ones

pytest.importorskip("triton")


def _cu(T):
    a = int(torch.randint(3, T // 2, ()))
    return torch.tensor([0, a, a + int(torch.randint(1, T - a, ())), T], dtype=torch.int32)


# every decay with and without a gate; varlen in half of them (each decay and each gate state batch and varlen)
@pytest.mark.parametrize("decay,gate,varlen", [(d, g, (i + g) % 2 == 1) for i, d in enumerate(["none", "constant",
                                                                                             "scalar"])
                                              for g in (False, True)])
def test_ones_against_reference(decay, gate, varlen):
    _check_ones(decay, gate, varlen, torch.float32, 1e-4)


@pytest.mark.parametrize("varlen", [False, True])
def test_ones_half_precision(varlen):
    """float16 inputs (half-precision matmuls; the normalizer's column summed in float32)."""
    _check_ones("scalar", True, varlen, torch.float16, 2e-3)


def _check_ones(decay, gate, varlen, dtype, tol):
    seed = fresh_seed()
    B, T, H, K, V, C = (1 if varlen else 2), 77, 2, 32, 16, 16
    N = 3 if varlen else B
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K) * K ** -0.5, torch.randn(B, T, H, V)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    ld = {"none": None, "constant": -torch.rand(H) * 0.2,
          "scalar": F.logsigmoid(torch.randn(B, T, H) + 2)}[decay]
    u = F.logsigmoid(torch.randn(B, T, H)) if gate else None
    S0, n0 = torch.randn(N, H, K, V) * 0.3, torch.randn(N, H, K) * 0.3
    cu = _cu(T) if varlen else None
    leaves = [q, k, v, S0, n0] + [x for x in (ld, u) if x is not None]
    for x in leaves:
        x.requires_grad_()
    o, den, (S, n) = linear_attention_with_ones(q, k, v, ld, initial_state=(S0, n0), output_final_state=True,
                                                cu_seqlens=cu, chunk_size=C, backend="triton", key_gate=u)
    ws = [torch.randn_like(t) for t in (o, den, S, n)]
    loss = sum((a * w).sum() for a, w in zip((o, den, S, n), ws))
    got = [o, den, S, n] + list(torch.autograd.grad(loss, leaves))
    # the float64 reference recurrence on [v, 1] (keys gated by exp(u) there)
    d = [x.detach().double().requires_grad_() for x in leaves]
    q2, k2, v2, S02, n02 = d[:5]
    rest = iter(d[5:])
    ld2 = next(rest) if ld is not None else None
    u2 = next(rest) if u is not None else None
    kk = k2 * u2.exp().unsqueeze(-1) if u2 is not None else k2
    o2, S2 = ula.linear_attention(q2, kk, torch.cat([v2, torch.ones_like(v2[..., :1])], -1), ld2,
                                  initial_state=torch.cat([S02, n02.unsqueeze(-1)], -1), output_final_state=True,
                                  cu_seqlens=cu, backend="reference")
    want = [o2[..., :V], o2[..., V], S2[..., :V], S2[..., V]]
    loss2 = sum((a * w.double()).sum() for a, w in zip(want, ws))
    want += list(torch.autograd.grad(loss2, d))
    names = ["o", "den", "S", "n", "dq", "dk", "dv", "dS0", "dn0"] + (["dld"] if ld is not None else []) + \
        (["du"] if u is not None else [])
    for name, a, b in zip(names, got, want):
        assert rel(a, b) <= tol, (name, rel(a, b), seed)


@pytest.mark.parametrize("backend,K", [("triton", 16), ("triton", 20), ("torch", 16)])  # fast path, padded, generic
def test_ones_initial_state_and_flag_checked_alike_on_every_path(backend, K):
    """(S0, n0) both tensors, n0 of S0's shape without V, dtype and device; output_final_state a bool. Before, the
    fast path ignored n0 without S0 and accepted a non-bool flag, the generic one failed inside torch.cat."""
    q, v = torch.randn(1, 20, 2, K), torch.randn(1, 20, 2, 16)
    S0, n0 = torch.zeros(1, 2, K, 16), torch.zeros(1, 2, K)
    bad = {"n0 without S0": ((None, n0), TypeError, "pair of tensors"),
           "S0 without n0": ((S0, None), TypeError, "pair of tensors"),
           "S0 alone": (S0, TypeError, "pair of tensors"),
           "n0 too wide": ((S0, torch.zeros(1, 2, K + 1)), ValueError, "n0 must have the shape"),
           "n0 in another dtype": ((S0, n0.double()), ValueError, "dtype torch.float32")}
    for name, (state, err, words) in bad.items():
        with pytest.raises(err, match=words):
            linear_attention_with_ones(q, q, v, initial_state=state, backend=backend)
    with pytest.raises(TypeError, match="output_final_state must be True or False"):
        linear_attention_with_ones(q, q, v, output_final_state="yes", backend=backend)


_SPLIT_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import ula
from helpers import fresh_seed, record_launches, rel
from ula.core.ones import linear_attention_with_ones
seed = fresh_seed()
B, T, H, K, V, C = 2, 77, 2, 32, 16, 16
rb = lambda x: x.bfloat16().float()  # values a bfloat16 model holds
q, k, v = rb(torch.randn(B, T, H, K)), rb(torch.randn(B, T, H, K) * K ** -0.5), rb(torch.randn(B, T, H, V))
S0, n0 = torch.randn(B, H, K, V) * 0.3, torch.randn(B, H, K) * 0.3
leaves = [q, k, v, S0, n0]
for x in leaves:
    x.requires_grad_()
o, den, (S, n) = linear_attention_with_ones(q, k, v, initial_state=(S0, n0), output_final_state=True,
                                            chunk_size=C, backend="triton")
wd, wn = torch.randn_like(den), torch.randn_like(n)
dn0, = torch.autograd.grad((den * wd).sum() + (n * wn).sum(), [n0])
d = [x.detach().double().requires_grad_() for x in leaves]
o2, S2 = ula.linear_attention(d[0], d[1], torch.cat([d[2], torch.ones_like(d[2][..., :1])], -1),
                              initial_state=torch.cat([d[3], d[4].unsqueeze(-1)], -1), output_final_state=True,
                              backend="reference")
dn02, = torch.autograd.grad((o2[..., V] * wd.double()).sum() + (S2[..., V] * wn.double()).sum(), [d[4]])
print(rel(o, o2[..., :V]), rel(den, o2[..., V]), rel(n, S2[..., V]), rel(dn0, dn02), seed)
"""


@pytest.mark.parametrize("state_tiles", [None, "8,32,16,4"])  # two row blocks per chunk: e's parts loaded for both
def test_ones_bf16_normalizer_sums_stay_float32(state_tiles):
    """bfloat16 matmuls (emulated in the interpreter: ULA_EMULATE_BF16=1 rounds matmul operands to bfloat16) take
    the state's normalizer column (no decay, no gate: normalized attention) as a matmul with its weights split in
    three bfloat16 parts (state.py, SPLIT): its sums, forward (n) and backward (weighted by the gradient of den:
    dn0), keep float32 accuracy, and so does den (its part through the state, q·n, in float32 products), where one
    bfloat16 rounding of the weights leaves ~1e-3 (measured with the parts after the first dropped); the outputs carry
    the bfloat16 error (emulation is on)."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, ULA_EMULATE_BF16="1", TRITON_INTERPRET="1")
    if state_tiles:
        env["ULA_TUNE_STATE"] = state_tiles
    out = subprocess.run([sys.executable, "-c", _SPLIT_SCRIPT, here], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    e_o, e_den, e_n, e_dn0, seed = out.stdout.split()[-5:]
    assert float(e_o) > 3e-4, out.stdout  # bfloat16 matmuls
    assert float(e_den) < 2e-6 and float(e_n) < 2e-6 and float(e_dn0) < 2e-6, out.stdout


def test_ones_backward_passes_with_a_decay_take_one_stage(monkeypatch):
    """With a decay (or a key gate) the column of ones' dQ and dK passes (their rank-one term) launch with one
    pipelining stage: at Triton's default the H100 gave results that differ from call to call (RESULTS.md sessions 13
    and 15). The forward with its normalizer (q read twice, RESULTS.md session 19) and the core's other output calls
    keep the default."""
    from ula.core.triton import utils
    seen = record_launches(monkeypatch, lambda kernel, w, cx, s: (int(cx["ONES"]), cx["R1"], s)
                           if kernel.fn.__name__ == "_output_kernel" else None)
    monkeypatch.setattr(utils, "_TUNING", {})
    q, k, v = torch.randn(1, 40, 2, 16), torch.randn(1, 40, 2, 16), torch.randn(1, 40, 2, 16)
    ld = F.logsigmoid(torch.randn(1, 40, 2) + 2)
    leaves = [x.requires_grad_() for x in (q, k, v, ld)]
    o, den, _ = linear_attention_with_ones(q, k, v, ld, chunk_size=16, backend="triton")
    (o.sum() + den.sum()).backward()
    assert sorted(seen, key=str) == sorted([(1, 0, None), (0, 1, 1), (0, 2, 1), (0, 0, None)], key=str), seen
    assert all(x.grad is not None for x in leaves)


def test_normalized_backward_passes_keep_default_stages(monkeypatch):
    """Normalized attention's dV pass carries its a part as a rank-one term (ula/ops/_normalized_fused.py) at Triton's
    default pipelining (the same o every call on the H100 at four shapes, and faster: RESULTS.md session 17); its
    dQ and dK calls (no decay, no gate) the default (RESULTS.md session 18), as its forward (session 19)."""
    import ula
    from ula.core.triton import utils
    seen = record_launches(monkeypatch, lambda kernel, w, cx, s: (int(cx["ONES"]), cx["R1"], s)
                           if kernel.fn.__name__ == "_output_kernel" else None)
    monkeypatch.setattr(utils, "_TUNING", {})
    q, k, v = (torch.randn(1, 40, 2, 16).requires_grad_() for _ in range(3))
    o, _ = ula.normalized_linear_attention(q, k, v, chunk_size=16, backend="triton")
    o.sum().backward()
    assert sorted(seen, key=str) == sorted([(1, 1, None), (0, 1, None), (0, 2, None), (0, 2, None)], key=str), seen


@pytest.mark.parametrize("ld_grad", [True, False])
def test_backward_sums_the_column_once(monkeypatch, ld_grad):
    """The backward's forward-direction state call takes the column's borders from the forward (n_given with the
    decay gradient's border terms, else nothing), not summing it again: the forward's and the state gradients'
    calls are the only ones with ONES (mLSTMexp at B1 T65536 H16 on an H200 7.43 -> 6.63 ms, RESULTS.md session 46)."""
    seen = record_launches(monkeypatch, lambda kernel, w, cx, s: (int(cx["ONES"]), int(cx["NGIVEN"]),
                                                                  int(cx["HAS_X"]))
                           if kernel.fn.__name__ == "_state_kernel" else None)
    q, k, v = torch.randn(1, 40, 2, 16), torch.randn(1, 40, 2, 16), torch.randn(1, 40, 2, 16)
    ld = F.logsigmoid(torch.randn(1, 40, 2) + 2).requires_grad_(ld_grad)
    o, den, _ = linear_attention_with_ones(q.requires_grad_(), k, v, ld, chunk_size=16, backend="triton")
    (o.sum() + den.sum()).backward()
    second = (0, 1, 1) if ld_grad else (0, 0, 0)
    assert seen == [(1, 0, 0), (1, 0, 0), second], seen
