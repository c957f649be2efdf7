"""The state kernel's segments (ula/core/triton/state.py: chunk_states walks NS segments of a long sequence side by
side, then joins them): forced on small shapes, every op that reads states against autograd through its float64
reference (the core's decay kinds in both directions, with the decay gradient's border terms; the column of ones of
normalized attention with its a part and of mLSTMexp), with a check that the joined calls ran; and which calls
split."""
import pytest
import torch

pytest.importorskip("triton")

import ula  # noqa: E402
from helpers import KINDS, compare_with_reference, fresh_seed, make_inputs  # noqa: E402
from test_ops_refs import check, compare, ref_mlstm_exp, ref_normalized  # noqa: E402
from ula.core import time_split  # noqa: E402
from ula.core.triton import state, state_join  # noqa: E402
from ula.core.triton.chunk import make_layout  # noqa: E402

T, C = 256, 32  # 8 chunks: 4 segments of 2 (T / 2 and 2 segments where a test says so)


@pytest.fixture
def joined(monkeypatch):
    """Segments forced (4 per sequence unless a test sets 2; the entry-term split of ula/core/time_split.py off, so
    that the state calls see the whole sequence) and the joins recorded: (reverse, segments, with n, with z) per state
    call."""
    monkeypatch.setattr(time_split, "_FORCED", "1")
    monkeypatch.setattr(state, "_FORCED", "4")
    calls = []
    orig = state.join_segments

    def wrapped(*a, **kw):
        calls.append((a[1], a[2], a[6] is not None, a[8] is not None))
        return orig(*a, **kw)
    monkeypatch.setattr(state, "join_segments", wrapped)
    return calls


def _mild(ld):
    """Decays that keep much of a state over a segment, so the joins weigh in the errors."""
    return None if ld is None else ld * 0.05


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("kind", KINDS)
def test_core_matches_reference(kind, reverse, joined, monkeypatch):
    """Two segments of 2 chunks (T = 128: the interpreter's time), two batch rows; the border terms' kernel over V in
    steps of 16 (V = 24: two)."""
    monkeypatch.setattr(state, "_FORCED", "2")
    monkeypatch.setattr(state_join, "_TERMS_BV", 16)
    seed = fresh_seed()
    q, k, v, ld, _, s0 = make_inputs(kind, False, 2, T // 2, 2, 16, 24, h0=True)
    op = lambda *a, **kw: ula.linear_attention(*a, chunk_size=C, backend="triton", **kw)  # noqa: E731
    errs = compare_with_reference(op, (q, k, v, _mild(ld), None, s0), reverse=reverse)
    bad = {n: f"{e:.2e}" for n, e in errs.items() if not e <= 1e-4}
    assert not bad, (bad, seed)
    # all three state calls split: the forward's, the backward's reverse one and its forward one (with a decay, the
    # last forms the decay gradient's border terms, which the join completes)
    walks = [r for r, S, *_ in joined if S == 2]
    assert walks.count(reverse) == 2 and walks.count(not reverse) == 1, joined


@pytest.mark.parametrize("h0", [False, True])
def test_normalized_matches_reference(h0, joined, monkeypatch):
    """The a part's sums (z) and the column of ones (n) join too; a per-head tensor a, b the core's scale. From an
    initial state 4 segments, else 2 (T = 128)."""
    S, T_ = (4, T) if h0 else (2, T // 2)
    monkeypatch.setattr(state, "_FORCED", str(S))
    seed = fresh_seed()
    B, H, K, V = 2, 2, 16, 16
    S0 = None
    if h0:  # a state a prefix could have left (normalized keys): Σ [k; 1][v; 1]ᵀ
        kp = torch.nn.functional.normalize(torch.randn(B, 6, H, K), dim=-1)
        vp = torch.randn(B, 6, H, V)
        one = lambda x: torch.cat([x, torch.ones_like(x[..., :1])], -1)  # noqa: E731
        S0 = torch.einsum("nthk,nthv->nhkv", one(kp), one(vp))
    inp = dict(q=torch.randn(B, T_, H, K), k=torch.randn(B, T_, H, K), v=torch.randn(B, T_, H, V),
               a=torch.rand(H) + 1.2, b=0.8, h0=S0)
    errs = compare(lambda h0, **x: ula.normalized_linear_attention(**x, initial_state=h0, output_final_state=True,
                                                                   chunk_size=C, backend="triton"),
                   lambda **x: ref_normalized(**x), inp)
    check(errs, seed)
    assert (False, S, True, True) in joined and (True, S, True, False) in joined, joined


def test_mlstm_exp_matches_reference(joined, monkeypatch):
    """mLSTMexp: a scalar decay, a key gate and the column of ones, from an initial state (C, n, m); 2 segments."""
    monkeypatch.setattr(state, "_FORCED", "2")
    seed = fresh_seed()
    B, T_, H, K, V = 2, T // 2, 2, 16, 16
    q, k = torch.randn(B, T_, H, K).abs() + 0.1, torch.randn(B, T_, H, K).abs() + 0.1
    i, f = torch.randn(B, T_, H) * 3, torch.randn(B, T_, H) * 2 + 4  # forget gates near 1: states last
    inp = dict(q=q, k=k, v=torch.randn(B, T_, H, V), i=i, f=f,
               h0=(torch.randn(B, H, K, V), torch.randn(B, H, K).abs(), torch.randn(B, H)))
    errs = compare(lambda h0, **a: ula.mlstm(**a, variant="exp", initial_state=h0, output_final_state=True,
                                             chunk_size=C, backend="triton"),
                   lambda h0, **a: ref_mlstm_exp(**a, h0=h0), inp)
    check({n: e for n, e in errs.items() if n != "dh02"}, seed)
    check({n: e for n, e in errs.items() if n == "dh02"}, seed, tol=1e-3)
    assert (False, 2, True, False) in joined and (True, 2, True, False) in joined, joined


def test_which_calls_split(monkeypatch):
    """On a faked 132-multiprocessor GPU: few sequences x heads over a long T split (segments of at least
    MIN_SEGMENT steps, whole chunks); many programs, varlen, T not a multiple of the segments' chunks, and calls
    with a right decay do not, nor with a left decay under 4 segments (but with the column of ones)."""
    monkeypatch.setattr(state, "_FORCED", None)
    monkeypatch.setattr(state, "multiprocessors", lambda device: 132)
    dev = torch.device("cpu")

    def seg(B, T, H, K=128, V=128, excluded=False, decayed=False, cu=None, C=128, ones=False):
        return state.segments(make_layout(B, T, C, cu, dev), T, H, K, V, excluded, decayed, dev, ones)

    assert seg(1, 32768, 16) == 2  # 64 programs
    assert seg(1, 16384, 8) == 4  # 32 programs, segments of 4096
    assert seg(1, 8192, 8) == 2  # segments of MIN_SEGMENT
    assert seg(2, 8192, 16) == 1  # 128 programs
    assert seg(1, 32768 + 64, 16) == 1  # not whole chunks in each segment
    assert seg(1, 32768, 16, excluded=True) == 1  # a right decay
    assert seg(1, 32768, 16, decayed=True) == 1  # a left decay: only at 4 segments or more
    assert seg(1, 16384, 8, decayed=True) == 4
    assert seg(1, 32768, 16, decayed=True, ones=True) == 2  # with the column of ones (mLSTMexp) from 2
    assert seg(2, 8192, 16, decayed=True, ones=True) == 1
    assert seg(1, 32768, 16, cu=torch.tensor([0, 32768])) == 1
    assert seg(1, 4096, 4) == 1  # segments under MIN_SEGMENT


@pytest.mark.parametrize("packed,decayed", [(True, True), (False, True), (True, False)])
def test_entering_column_matches_reference(packed, decayed):
    """state_join.add_entering_column: the column's borders of a walk from zero, plus each sequence's extra initial
    column carried through the decays to every border, against a float64 walk of the column from that initial
    column (ula/core/ones.py's backward under context parallelism: the forward's borders, from another n0)."""
    import torch.nn.functional as F
    from ula.core.autograd import canonical_left
    from ula.core.triton.cumsum import chunk_cumsum
    from ula.core.triton.utils import DOT_F32
    fresh_seed()
    B, Tn, H, K, V, Cn = (1, 77, 2, 16, 16, 16) if packed else (2, 77, 2, 16, 16, 16)
    cu = torch.tensor([0, 37, 40, 77], dtype=torch.int32) if packed else None
    N = 3 if packed else B
    k, v = torch.randn(B, Tn, H, K), torch.randn(B, Tn, H, V)
    ld = F.logsigmoid(torch.randn(B, Tn, H) + 2) if decayed else None
    delta = torch.randn(N, H, K)
    layout = make_layout(B, Tn, Cn, cu, k.device)
    b = chunk_cumsum(canonical_left(ld, Tn), layout, False) if decayed else None
    nb = state.chunk_states(k, v, b, None, None, layout, False, DOT_F32, ones=True)[3][0]
    got = state_join.add_entering_column(nb.clone(), b, layout, delta)
    want = torch.empty_like(got, dtype=torch.float64)
    bounds = cu.tolist() if packed else [0, Tn]
    c0 = 0
    for row in range(B):
        for s in range(len(bounds) - 1):
            n = delta[s if packed else row].double()
            lo, hi = bounds[s], bounds[s + 1]
            for t in range(lo, hi):
                if decayed:
                    n = n * ld[row, t].double().exp()[:, None]
                n = n + k[row, t].double()
                if t + 1 == hi or (t + 1 - lo) % Cn == 0:  # a chunk's last step: its border
                    want[row, :, c0] = n
                    c0 += 1
        c0 = c0 if packed else 0
    assert (got.double() - want).abs().max() / want.abs().max() < 1e-5
