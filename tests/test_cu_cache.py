"""cu_seqlens is read on the host once per tensor (ula/core/cu_cache.py): every op, pass and chunk size reuses its
values and layouts; a tensor written in place, a new tensor and an inference-mode tensor are read again; results
stay those of the float64 reference."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import ula  # noqa: E402
from helpers import compare_with_reference, fresh_seed, make_inputs  # noqa: E402
from test_ops_refs import check  # noqa: E402
from ula.core import cu_cache  # noqa: E402
from ula.ops._common import PackedTokens  # noqa: E402


@pytest.fixture
def reads(monkeypatch):
    """The host reads of cu_seqlens' values, counted."""
    seen = []
    real = cu_cache._read

    def counted(cu):
        seen.append(tuple(cu.tolist()))
        return real(cu)
    monkeypatch.setattr(cu_cache, "_read", counted)
    return seen


def test_one_read_for_every_op_and_pass(reads):
    """Forward and backward of the core (two chunk sizes, a decay), GLA, mLSTMexp, normalized attention and GSA on
    one cu_seqlens: one read."""
    cu = torch.tensor([0, 9, 30, 41])
    B, T, H, K = 1, 41, 2, 16
    q, k, v = (torch.randn(B, T, H, K, requires_grad=True) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, K))
    f = torch.randn(B, T, H)
    outs = [ula.linear_attention(q, k, v, g, cu_seqlens=cu, chunk_size=c, backend="triton")[0] for c in (16, 32)]
    outs += [ula.gla(q, k, v, g, cu_seqlens=cu, backend="triton")[0],
             ula.mlstm(q, k, v, f, f + 2, cu_seqlens=cu, backend="triton")[0],
             ula.normalized_linear_attention(q, k, v, cu_seqlens=cu, backend="triton")[0],
             ula.gsa(q, k, v, torch.randn(B, T, H, 8), F.logsigmoid(torch.randn(B, T, H, 8)), cu_seqlens=cu,
                     backend="triton")[0]]
    sum(o.sum() for o in outs).backward()
    assert reads == [(0, 9, 30, 41)], reads


def test_torch_path_reads_through_the_cache(reads, monkeypatch):
    """The PyTorch path too (its chunk recurrence walks the sequences on the host): after one eager call on a
    cu_seqlens, the core, GLA, mLSTMexp and normalized attention, forward and backward, read its values from nothing
    but the cache, as a CUDA graph capture needs (session 35: `.tolist()` at every call failed in a capture).
    Any other read of that tensor's values fails here. Results against float64."""
    cu = torch.tensor([0, 9, 30, 41])
    B, T, H, K = 1, 41, 2, 16
    q, k, v = (torch.randn(B, T, H, K, dtype=torch.float64, requires_grad=True) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, K, dtype=torch.float64))
    f = torch.randn(B, T, H, dtype=torch.float64)
    ref = ula.linear_attention(q, k, v, g, cu_seqlens=cu, backend="reference")[0]
    assert reads == [(0, 9, 30, 41)], reads

    def guarded(name):
        real = getattr(torch.Tensor, name)

        def read(t, *a, **kw):
            if t is cu:  # not an assert: pytest's report would print the tensor, which reads it again
                raise AssertionError(f"cu_seqlens read on the host by .{name}() outside ula.core.cu_cache")
            return real(t, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, read)
    for name in ("tolist", "item", "numpy", "__int__", "__index__", "__iter__"):
        guarded(name)
    o = ula.linear_attention(q, k, v, g, cu_seqlens=cu, backend="torch")[0]
    assert (o - ref).abs().max() < 1e-10
    outs = [o, ula.gla(q, k, v, g, cu_seqlens=cu, backend="torch")[0],
            ula.mlstm(q, k, v, f, f + 2, cu_seqlens=cu, backend="torch")[0],
            ula.normalized_linear_attention(q, k, v, cu_seqlens=cu, backend="torch")[0]]
    sum(o.sum() for o in outs).backward()
    assert reads == [(0, 9, 30, 41)], reads


@pytest.mark.parametrize("how", ["in_place", "new_tensor"])
def test_changed_boundaries_are_read_again(reads, how):
    """The same call after cu_seqlens changed (written in place, or a new tensor) takes the new boundaries: against
    the float64 reference both times, two reads."""
    seed = fresh_seed()
    q, k, v, ld, _, h0 = make_inputs("scalar", False, 1, 50, 2, 16, 16, N=3)
    cu = torch.tensor([0, 7, 33, 50])
    op = lambda *a, **kw: ula.linear_attention(*a, chunk_size=16, backend="triton", **kw)  # noqa: E731
    check(compare_with_reference(op, (q, k, v, ld, None, h0), cu_seqlens=cu), seed)
    if how == "in_place":
        cu[1] = 20
    else:
        cu = torch.tensor([0, 20, 33, 50])
    check(compare_with_reference(op, (q, k, v, ld, None, h0), cu_seqlens=cu), seed)
    assert reads == [(0, 7, 33, 50), (0, 20, 33, 50)], reads


def test_inference_tensor_is_read_each_call(reads):
    """A cu_seqlens made under torch.inference_mode() has no version counter: read at every use, right each time."""
    q, k, v, ld, _, _ = make_inputs("vector", False, 1, 30, 1, 16, 16)
    with torch.inference_mode():
        cu = torch.tensor([0, 11, 30])
        o, _ = ula.linear_attention(q, k, v, ld, cu_seqlens=cu, chunk_size=16, backend="triton")
        r, _ = ula.linear_attention(q, k, v, ld, cu_seqlens=cu, backend="reference")
    assert torch.allclose(o.double(), r.double(), atol=1e-4, rtol=1e-4)
    assert len(reads) >= 2 and set(reads) == {(0, 11, 30)}, reads


def test_families_build_one_token_map(monkeypatch):
    """Two mLSTMexp calls in PyTorch (two layers of a model), forward and backward, and normalized attention and GSA
    beside them, on one cu_seqlens: the families' per-token map (PackedTokens, which mLSTMexp's PyTorch gate scan
    and normalized attention's PyTorch epilogue take) is built once, and again for a new tensor."""
    built = []
    real = PackedTokens.__init__

    def counted(self, cu, T, device):
        built.append(cu is not None)
        real(self, cu, T, device)
    monkeypatch.setattr(PackedTokens, "__init__", counted)
    B, T, H, K = 1, 41, 2, 16
    q, k, v = (torch.randn(B, T, H, K, requires_grad=True) for _ in range(3))
    f = torch.randn(B, T, H)
    for cu in (torch.tensor([0, 9, 30, 41]), torch.tensor([0, 9, 30, 41])):
        outs = [ula.mlstm(q, k, v, f, f + 2, cu_seqlens=cu, backend="torch")[0],
                ula.mlstm(q, k, v, f + 1, f, cu_seqlens=cu, backend="torch")[0],
                ula.normalized_linear_attention(q, k, v, cu_seqlens=cu, backend="torch")[0],
                ula.gsa(q, k, v, torch.randn(B, T, H, 8), None, cu_seqlens=cu, backend="torch")[0]]
        sum(o.sum() for o in outs).backward()
    assert built.count(True) == 2, built


def test_softmax_layer_packed_reads_nothing(reads):
    """The softmax layer only maps packed tokens to their sequence and position (PackedTokens' seq, pos): it never
    reads cu_seqlens on the host (on a GPU, a wait for everything queued), and matches the sequences run apart."""
    from ula.layers import MIXERS
    layer = MIXERS["softmax"](32, 2)
    x = torch.randn(1, 30, 32)
    y, _ = layer(x, cu_seqlens=torch.tensor([0, 11, 30]))
    assert reads == [], reads
    apart = torch.cat([layer(x[:, :11])[0], layer(x[:, 11:])[0]], 1)
    assert torch.allclose(y, apart, atol=1e-5, rtol=1e-5)


def test_entries_go_with_their_tensor():
    """The cache holds no reference to a cu_seqlens tensor, nor do the layouts it keeps: its entry leaves with it."""
    cu = torch.tensor([0, 5, 12])
    assert cu_cache.host_values(cu) == (0, 5, 12)
    assert PackedTokens.of(cu, 12, cu.device) is PackedTokens.of(cu, 12, cu.device)
    key = id(cu)
    assert key in cu_cache._ENTRIES
    del cu
    assert key not in cu_cache._ENTRIES
