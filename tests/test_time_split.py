"""A long sequence split along T on one GPU (ula/core/time_split.py): the core over segments as batch rows, the
scan of their states and the entry terms in place, against autograd through the float64 reference recurrence:
output, final state and every gradient, each decay kind, 2 and 4 segments, with and without an initial state, a
key gate; and which calls split."""
import pytest
import torch

pytest.importorskip("triton")

import ula  # noqa: E402
from helpers import KINDS, compare_with_reference, fresh_seed, make_inputs, rel  # noqa: E402
from test_ops_refs import check  # noqa: E402
from ula.core import time_split  # noqa: E402
from ula.core.reference import reference_linear_attention  # noqa: E402


def _mild(ld):
    """Decays that keep much of a state over a segment (~0.75 of it over 128 steps): the scan's D_j ⊙ E_{j-1} and the
    entry terms then weigh in the errors (at the helpers' ~0.95 per step a state fades to ~1e-3 over a segment)."""
    return None if ld is None else ld * 0.05


@pytest.fixture
def counted(monkeypatch):
    """The number of split calls made (split_run wrapped), so a test knows the split path ran."""
    calls = []
    orig = time_split.split_run

    def wrapped(*a, **kw):
        calls.append(a[-2])
        return orig(*a, **kw)
    monkeypatch.setattr(time_split, "split_run", wrapped)
    return calls


@pytest.mark.parametrize("h0,S", [(True, 2), (False, 4)])  # each kind with and without an initial state
@pytest.mark.parametrize("kind", KINDS)
def test_split_matches_reference(kind, h0, S, monkeypatch, counted):
    monkeypatch.setattr(time_split, "_FORCED", str(S))
    seed = fresh_seed()
    # two batch rows with 2 segments, one with 4 (the interpreter's time)
    q, k, v, ld, _, s0 = make_inputs(kind, False, 2 if S == 2 else 1, 256, 2, 16, 32, h0=h0)
    ld = _mild(ld)
    op = lambda *a, **kw: ula.linear_attention(*a, chunk_size=32, backend="triton", **kw)  # noqa: E731
    check(compare_with_reference(op, (q, k, v, ld, None, s0)), seed)
    assert counted == [S]


@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_split_with_key_gate(kind, monkeypatch, counted):
    """mLSTM's form: the input gate as a log key gate, split with the sequence (its gradient from the core)."""
    monkeypatch.setattr(time_split, "_FORCED", "2")
    seed = fresh_seed()
    q, k, v, ld, _, h0 = make_inputs(kind, False, 1, 256, 2, 16, 16)
    ld = _mild(ld)
    u = torch.randn(1, 256, 2) - 0.5
    leaves = [q, k, v, ld, u, h0]
    ours = [x.detach().clone().requires_grad_() for x in leaves]
    refs = [x.detach().double().requires_grad_() for x in leaves]
    o, S = ula.linear_attention(*ours[:4], key_gate=ours[4], initial_state=ours[5], output_final_state=True,
                                chunk_size=32, backend="triton")
    q2, k2, v2, ld2, u2, h2 = refs
    o_ref, S_ref = reference_linear_attention(q2, k2 * u2.exp().unsqueeze(-1), v2, ld2, initial_state=h2,
                                              output_final_state=True)
    do, dS = torch.randn_like(o_ref), torch.randn_like(S_ref)
    ((o.double() * do).sum() + (S.double() * dS).sum()).backward()
    ((o_ref * do).sum() + (S_ref * dS).sum()).backward()
    errs = {"o": rel(o, o_ref), "S": rel(S, S_ref)}
    for name, a, b in zip(["q", "k", "v", "ld", "key_gate", "h0"], ours, refs):
        errs["d" + name] = rel(a.grad, b.grad)
    check(errs, seed)
    assert counted == [2]


def test_split_sum_loss_and_strided_inputs(monkeypatch, counted):
    """A loss o.sum() (its gradient reaches the entry term expanded, every stride 0) and q, k, v given as strided views:
    the split's output and gradients against autograd through the float64 reference."""
    monkeypatch.setattr(time_split, "_FORCED", "2")
    seed = fresh_seed()
    q, k, v, ld, _, _ = make_inputs("vector", False, 1, 256, 2, 16, 16)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))  # [B, T, H, D] strides of [B, H, T, D]
    ld = _mild(ld)
    assert not q.is_contiguous()
    ours = [x.detach().clone().requires_grad_() for x in (q, k, v, ld)]
    refs = [x.detach().double().requires_grad_() for x in (q, k, v, ld)]
    o, S = ula.linear_attention(*ours, output_final_state=True, chunk_size=32, backend="triton")
    o_ref, S_ref = reference_linear_attention(*refs, output_final_state=True)
    (o.sum() + S.sum()).backward()
    (o_ref.sum() + S_ref.sum()).backward()
    errs = {"o": rel(o, o_ref), "S": rel(S, S_ref)}
    errs.update({"d" + n: rel(a.grad, b.grad) for n, a, b in zip(("q", "k", "v", "ld"), ours, refs)})
    check(errs, seed)
    assert counted == [2]


def test_split_without_gradients(monkeypatch, counted):
    """Inference (no_grad): output and final state against the float64 reference."""
    monkeypatch.setattr(time_split, "_FORCED", "4")
    seed = fresh_seed()
    q, k, v, ld, _, h0 = make_inputs("vector", False, 2, 256, 2, 16, 16)
    ld = _mild(ld)
    with torch.no_grad():
        got = ula.linear_attention(q, k, v, ld, initial_state=h0, output_final_state=True, chunk_size=32,
                                   backend="triton")
        want = reference_linear_attention(q.double(), k.double(), v.double(), ld.double(), initial_state=h0.double(),
                                          output_final_state=True)
    check({"o": rel(got[0], want[0]), "S": rel(got[1], want[1])}, seed)
    assert counted == [4]


def test_which_calls_split(monkeypatch):
    """Only forward, left-decay (or none), non-varlen calls whose T holds whole segments of chunks split."""
    monkeypatch.setattr(time_split, "_FORCED", "2")
    q, v = torch.zeros(1, 256, 2, 16), torch.zeros(1, 256, 2, 16)
    ld, rd = torch.zeros(1, 256, 2), torch.zeros(1, 256, 2, 16)
    seg = time_split.segments
    assert seg(q, v, ld, None, None, False, "triton", 64) == 2
    assert seg(q, v, ld, rd, None, False, "triton", 64) == 1  # a right decay
    assert seg(q, v, ld, None, torch.tensor([0, 100, 256]), False, "triton", 64) == 1  # varlen
    assert seg(q, v, ld, None, None, True, "triton", 64) == 1  # reverse
    assert seg(q, v, ld, None, None, False, "torch", 64) == 1  # the PyTorch backend
    assert seg(q, v, ld, None, None, False, "triton", 256) == 1  # 128-step segments hold no whole 256-step chunk
    assert seg(q.double(), v.double(), ld, None, None, False, "triton", 64) == 1  # float64 (the PyTorch path)
    wide_v, vec = torch.zeros(1, 256, 2, 272), torch.zeros(1, 256, 2, 16)
    assert seg(q, wide_v, vec, None, None, False, "triton", 64) == 1  # a decay per feature over V > 256 features
    assert seg(q, wide_v, ld, None, None, False, "triton", 64) == 2  # V > 256 with a decay per step splits
    monkeypatch.setattr(time_split, "_FORCED", None)
    assert seg(q, v, ld, None, None, False, "triton", 64) == 1  # off CUDA the heuristic never splits


@pytest.mark.parametrize("B,T,H,D,decay,grad,want", [
    (1, 32768, 16, 128, True, True, 2),   # 64 state programs on 132 multiprocessors: two segments
    (1, 65536, 16, 128, True, True, 2),
    (1, 16384, 8, 128, False, True, 1),   # without a decay the state kernel splits its own walks (state.segments)
    (1, 16384, 8, 128, True, True, 1),    # 32 programs: the state kernel splits its walks in 4 (faster there)
    (1, 32768, 8, 128, True, True, 1),
    (1, 8192, 16, 128, True, True, 1),
    (2, 8192, 16, 128, True, True, 1),    # 128 programs: measured slower split
    (1, 32768, 16, 128, True, False, 1),  # a forward alone with a decay gains nothing
    (1, 32768, 16, 128, False, False, 1),
    (1, 32768 + 128, 16, 128, True, True, 1),  # T holds no whole segments of chunks
    (1, 65536, 4, 64, True, True, 1),
])
def test_segments_heuristic(B, T, H, D, decay, grad, want, monkeypatch):
    """The default choice on a GPU with 132 multiprocessors (an H100; faked here)."""
    assert _segments_on_h100(B, T, H, D, decay, grad, None, monkeypatch) == want


@pytest.mark.parametrize("B,T,H,D,want", [
    (1, 16384, 8, 128, 2),   # 32 programs, segments of at least 8192 steps
    (1, 65536, 4, 64, 8),    # 4 programs: 8 segments, MIN_SEGMENT stops there
])
def test_segments_where_the_state_kernel_does_not_split(B, T, H, D, want, monkeypatch):
    """With the state kernel's split off (ULA_STATE_SPLIT=1) this split takes the decayed training calls that the
    state kernel would otherwise split itself."""
    assert _segments_on_h100(B, T, H, D, True, True, "1", monkeypatch) == want


def _segments_on_h100(B, T, H, D, decay, grad, state_forced, monkeypatch):
    """time_split.segments on a faked 132-multiprocessor GPU, the state kernel's split at state_forced (None: its
    default; the count is state.split_count's, shared with it)."""
    from ula.core.triton import state
    monkeypatch.setattr(time_split, "_FORCED", None)
    monkeypatch.setattr(state, "_FORCED", state_forced)
    monkeypatch.setattr(state, "multiprocessors", lambda device: 132)
    q = torch.zeros(1, 1, 1, 1).expand(B, T, H, D)  # shapes only: no memory behind them
    ld = torch.zeros(1, 1, 1).expand(B, T, H) if decay else None
    return time_split.segments(q, q, ld, None, None, False, "triton", 128, grad)


def test_split_with_huge_finite_log_decays(monkeypatch, counted):
    """Finite log decays of -3e38 (accepted) in the second segment: summed over a chunk they overflow to -inf, and
    the entry kernels' carries were formed as inclusive - total, -inf - (-inf) = NaN over the whole segment (output
    and gradients). The carries are now shifted sums. Output, final state and gradients equal the unsplit call's."""
    seed = fresh_seed()
    q, k, v, ld, _, h0 = make_inputs("vector", False, 1, 128, 1, 16, 16)
    ld = ld.detach().clone()
    ld[:, 70:72] = -3e38
    do = torch.randn_like(v)
    res = {}
    for forced in (None, "2"):
        monkeypatch.setattr(time_split, "_FORCED", forced)
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v, ld, h0)]
        o, S = ula.linear_attention(*xs[:4], initial_state=xs[4], output_final_state=True, backend="triton",
                                    chunk_size=64)
        ((o * do).sum() + S.sum()).backward()
        res[forced] = [o, S] + [x.grad for x in xs]
    assert counted == [2]
    errs = {n: rel(b, a) for n, a, b in zip(("o", "S", "dq", "dk", "dv", "dld", "dh0"), res[None], res["2"])}
    check(errs, seed)


def test_no_split_for_a_decay_per_feature_over_256_values(monkeypatch, counted):
    """A vector decay with K <= 256 < V takes no split (its calls of 256 features cannot take a split's entering
    state: a split chosen for it raised a ValueError); forward and gradients against the reference."""
    monkeypatch.setattr(time_split, "_FORCED", "2")
    seed = fresh_seed()
    q, k, v, ld, _, _ = make_inputs("vector", False, 1, 256, 1, 16, 272, h0=False)
    op = lambda *a, **kw: ula.linear_attention(*a, chunk_size=64, backend="triton", **kw)  # noqa: E731
    check(compare_with_reference(op, (q, k, v, _mild(ld), None, None)), seed)
    assert counted == []
