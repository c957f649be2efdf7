"""The fused mLSTMexp gate scan (ula/ops/_mlstm_gate_kernels.py) against its PyTorch form `_exp_gates`: every
output and the gradients of i, f and m_0 (random upstream gradients on ld', logw, m and m_T) in float64, with
blocks cut mid-sequence, varlen, large gates, the 0 floor or m_0 winning at the start, exact ties; then
mlstm(variant="exp") on the Triton backend against the torch backend. These run the parallel kernels (the
default); the last tests set tiny blocks and compare them with the sequential ones too."""
import pytest
import torch

import ula
from helpers import fresh_seed, rel

pytest.importorskip("triton")

from ula.ops._common import PackedTokens  # noqa: E402
from ula.ops._mlstm_gate_kernels import mlstm_exp_gates  # noqa: E402
from ula.ops.mlstm import _exp_gates  # noqa: E402

D = torch.float64
NAMES = ("ldp", "logw", "m", "mT")


def _upstream(i, cu):
    """Random upstream gradients on ld', logw, m and m_T."""
    N = i.shape[0] if cu is None else len(cu) - 1
    return [torch.randn(s, dtype=D) for s in (i.shape, i.shape, i.shape, (N, i.shape[2]))]


def _run_gates(fused, i, f, m0, cu, gs, used=NAMES):
    """(outputs, gradients of i, f and m_0) of the kernel (fused) or of the PyTorch code, the upstream gradients gs
    on the outputs named in `used`."""
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in (i, f, m0)]
    outs = mlstm_exp_gates(*leaves, cu) if fused else _exp_gates(
        *leaves, None if cu is None else PackedTokens(cu, i.shape[1], i.device))
    picked = [(o, g) for n, o, g in zip(NAMES, outs, gs) if n in used]
    live = [x for x in leaves if x is not None]
    grads = torch.autograd.grad([o for o, _ in picked], live, [g for _, g in picked], allow_unused=True)
    return list(outs), list(grads)


def _both(i, f, m0, cu, used=NAMES):
    """(outputs, gradients) of the kernel and of the PyTorch code on the same inputs and upstream gradients
    (only on the outputs named in `used`)."""
    gs = _upstream(i, cu)
    return [_run_gates(fused, i, f, m0, cu, gs, used) for fused in (True, False)]


def _check(i, f, m0, cu, seed, used=NAMES, tol=1e-12):
    (outs, grads), (outs_r, grads_r) = _both(i, f, m0, cu, used)
    _compare(outs, grads, outs_r, grads_r, i, seed, tol)


def _compare(outs, grads, outs_r, grads_r, i, seed, tol):
    """The kernel's outputs and gradients (di, df, dm0) against `_exp_gates`' (outs_r, grads_r)."""
    # F is summed in another order: values agree to rounding at the size of F (it grows with t)
    scale = 1.0 + float(outs_r[2].detach().abs().max()) + float(i.abs().max())
    for n, a, b in zip(NAMES, outs, outs_r):
        assert a.dtype == b.dtype and a.shape == b.shape, n
        assert (a - b).abs().max() <= tol * scale, (n, seed)
    for n, a, b in zip(("di", "df", "dm0"), grads, grads_r):
        if b is None:
            assert a is None or not a.any(), (n, seed)
            continue
        assert (a - b).abs().max() <= tol * (1.0 + b.abs().max()), (n, seed)


def _gates(B, T, H, large=False):
    if large:  # ĩ up to ±30, f̃ strongly negative and positive: the max switches often
        return torch.rand(B, T, H, dtype=D) * 60 - 30, torch.randn(B, T, H, dtype=D) * 15
    return torch.randn(B, T, H, dtype=D) * 3, torch.randn(B, T, H, dtype=D) * 2 + 2


CASES = {  # (B, T, H, m_0, cu_seqlens, large gates)
    "T37": (2, 37, 3, False, None, False),
    "T37-m0": (2, 37, 3, True, None, False),
    "T300-large-m0": (1, 300, 2, True, None, True),
    "T300-large": (2, 300, 1, False, None, True),
    "varlen-m0": (1, 90, 5, True, [0, 1, 38, 39, 90], True),
    "varlen": (1, 45, 2, False, [0, 33, 34, 45], False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gates_match_torch(case, one_thread):
    seed = fresh_seed()
    B, T, H, has_m0, cu, large = CASES[case]
    i, f = _gates(B, T, H, large)
    cu = None if cu is None else torch.tensor(cu)
    N = B if cu is None else len(cu) - 1
    m0 = torch.randn(N, H, dtype=D) * 5 if has_m0 else None
    _check(i, f, m0, cu, seed)


@pytest.mark.parametrize("varlen", [False, True])
def test_head_blocks(varlen, one_thread):
    """Several heads per program (BH = 4 with H = 3 and 6: masked heads) and 16-step blocks, as tuned by hand."""
    from ula.core.triton.utils import set_tuning
    seed = fresh_seed()
    set_tuning("mlstm_gates", "16,4,4")
    try:
        for H in (3, 6):
            cu = torch.tensor([0, 1, 30, 41]) if varlen else None
            i, f = _gates(1 if varlen else 2, 41, H, large=True)
            _check(i, f, torch.randn(3 if varlen else 2, H, dtype=D), cu, seed)
    finally:
        set_tuning("mlstm_gates", None)


@pytest.mark.parametrize("has_m0", [False, True])
def test_floor_or_m0_wins_at_the_start(has_m0, one_thread):
    """The 0 floor (a very negative ĩ) or a large m_0 gives M for a stretch, across a block border, then
    the input gates take over."""
    seed = fresh_seed()
    i, f = _gates(2, 70, 2)
    i[:, :45] -= 40.0
    m0 = torch.full((2, 2), 25.0, dtype=D) + torch.rand(2, 2, dtype=D) if has_m0 else None
    if has_m0:
        i[:, 45:] += 40.0
    _check(i, f, m0, None, seed)


@pytest.mark.parametrize("has_m0", [False, True])
def test_exact_ties(has_m0, one_thread):
    """f̃ = 1000 makes logσ(f̃) exactly 0, so i − F is i: integer gates tie within the cummax, with the 0 floor
    and with m_0; the later index, clamp_min's >= and torch.maximum's even split are followed exactly."""
    seed = fresh_seed()
    i = torch.randint(-3, 4, (2, 50, 3)).to(D)
    i[0, :, 0] = torch.tensor([0.0, -1, 0, 2, 2, 1, 2] + [-1] * 43)  # ties with the floor, then in the cummax
    f = torch.full_like(i, 1000.0)
    m0 = torch.randint(-1, 3, (2, 3)).to(D) if has_m0 else None
    if has_m0:
        m0[0, 0] = 2.0  # ties with m_0
    _check(i, f, m0, None, seed, tol=1e-15)  # sums of gradients in another order


@pytest.mark.parametrize("used", [("mT",), ("ldp", "logw"), ("m",)])
def test_some_outputs_unused(used, one_thread):
    """Unused outputs get no gradient (None): the kernel skips them."""
    seed = fresh_seed()
    i, f = _gates(1, 40, 2, large=True)
    _check(i, f, torch.randn(1, 2, dtype=D), None, seed, used=used)


def test_float32_strided_inputs(one_thread):
    """float32 gates read through their strides (halves of one projection), ld' and logw written in float32
    (as the core takes them), gradients in the inputs' dtypes; no gradient recorded without one needed."""
    seed = fresh_seed()
    proj = torch.randn(1, 45, 2, 4) * 3
    i, f = proj[..., 0, :], proj[..., 1, :] + 2
    assert not i.is_contiguous()
    cu = torch.tensor([0, 20, 45], dtype=torch.int32)
    m0 = torch.randn(2, 4)
    leaves = [x.detach().clone().requires_grad_() for x in (i, f, m0)]
    leaves_r = [x.detach().double().requires_grad_() for x in (i, f, m0)]
    outs = mlstm_exp_gates(*leaves, cu, torch.float32)
    ref = _exp_gates(*leaves_r, PackedTokens(cu, 45, i.device))
    assert [o.dtype for o in outs] == [torch.float32, torch.float32, D, D]
    for a, b in zip(outs, ref):
        assert rel(a, b) <= 1e-7, seed
    gs = [torch.randn(o.shape, dtype=D) for o in outs]
    grads = torch.autograd.grad(outs, leaves, [g.to(o.dtype) for g, o in zip(gs, outs)])
    grads_r = torch.autograd.grad(ref, leaves_r, [g.to(o.dtype).double() for g, o in zip(gs, outs)])
    assert [g.dtype for g in grads] == [torch.float32] * 3
    for a, b in zip(grads, grads_r):
        assert rel(a, b) <= 1e-6, seed
    with torch.no_grad():
        again = mlstm_exp_gates(i, f, m0, cu, torch.float32)
    for a, b in zip(outs, again):
        assert torch.equal(a, b), seed


@pytest.mark.parametrize("varlen", [False, True])
def test_mlstm_exp_triton_matches_torch(varlen, one_thread, monkeypatch):
    """mlstm(variant="exp") on the Triton backend (fused gates, float32) against the torch backend in float64: h,
    the final state and every gradient, with large gates and an initial state. The gradient of the initial max
    state m_0 is held to an absolute bound too: with large gates m_0 barely reaches h, its true gradient can be
    ~1e-7, where float32's noise (~5e-8 seen) is a large relative error."""
    from ula.ops import _mlstm_gate_kernels as kernels
    calls = []
    fused = kernels.mlstm_exp_gates
    monkeypatch.setattr(kernels, "mlstm_exp_gates", lambda *a: calls.append(1) or fused(*a))
    seed = fresh_seed()
    H, K, V = 2, 16, 16
    cu = torch.tensor([0, 1, 20, 41]) if varlen else None
    B, T = (1, 41) if varlen else (2, 29)
    N = B if cu is None else 3
    i, f = _gates(B, T, H, large=True)
    q, k = torch.rand(B, T, H, K) + 0.1, torch.rand(B, T, H, K) + 0.1
    v = torch.randn(B, T, H, V)
    h0 = (torch.randn(N, H, K, V), torch.randn(N, H, K).abs(), torch.randn(N, H))
    inputs = [q, k, v, i.float(), f.float(), *h0]
    res = []
    for backend, dt in (("triton", torch.float32), ("torch", torch.float64)):
        xs = [x.detach().to(dt).requires_grad_() for x in inputs]
        h, (C, n, m) = ula.mlstm(*xs[:5], initial_state=tuple(xs[5:]), output_final_state=True, cu_seqlens=cu,
                                 chunk_size=16, backend=backend)
        torch.manual_seed(seed)  # the same weights for both runs (drawn in float32)
        loss = sum((o * torch.randn(o.shape).to(o.dtype)).sum() for o in (h, C, n, m))
        res.append([h, C, n, m] + list(torch.autograd.grad(loss, xs)))
    assert calls == [1]  # the Triton backend's call only
    for j, (a, b) in enumerate(zip(*res)):
        if j == len(res[0]) - 1:  # dm_0
            assert (a.double() - b).norm() <= 1e-3 * b.norm() + 1e-6, (j, seed)
        else:
            assert rel(a, b) <= 1e-4, (j, seed)


# The parallel kernels (PARALLEL, the default): a block per program, carries from the other blocks' summaries.
# Tiny blocks (BT = 4) and pieces (NC = 2 summaries read at a time) make every carry cross many block and piece
# borders; the sequential kernels (PARALLEL = False) and `_exp_gates` are the references.


def _grads_of(i, f, m0, cu, gs, parallel, monkeypatch):
    from ula.ops import _mlstm_gate_kernels as kernels
    monkeypatch.setattr(kernels, "PARALLEL", parallel)
    outs, grads = _run_gates(True, i, f, m0, cu, gs)
    return outs + grads


def _check_paths(i, f, m0, cu, seed, monkeypatch, tiles="4,1,4,2", tol=1e-12, exact_forward=False):
    """The parallel kernels against `_exp_gates` (as _check) and against the sequential kernels, under `tiles`, on
    the same upstream gradients. exact_forward: F exactly 0 (logσ(f) = 0), so the forward has no sum to re-associate
    and agrees bitwise."""
    from ula.core.triton.utils import set_tuning
    gs = _upstream(i, cu)
    set_tuning("mlstm_gates", tiles)
    try:
        par = _grads_of(i, f, m0, cu, gs, True, monkeypatch)
        seq = _grads_of(i, f, m0, cu, gs, False, monkeypatch)
    finally:
        set_tuning("mlstm_gates", None)
    _compare(par[:4], par[4:], *_run_gates(False, i, f, m0, cu, gs), i, seed, tol)
    for n, a, b in zip(NAMES + ("di", "df", "dm0"), par, seq):
        if exact_forward and n in NAMES:
            assert torch.equal(a, b), (n, seed)
        assert (a - b).abs().max() <= tol * (1.0 + b.abs().max()), (n, seed)


@pytest.mark.parametrize("has_m0", [False, True])
def test_parallel_long_runs_exact(has_m0, one_thread, monkeypatch):
    """f̃ = 1000 (logσ(f̃) = 0, F = 0): integer gates, so exact ties everywhere; an early large ĩ stays the max for
    many blocks (ties with it later: the later step takes over), and a run starts mid-block and spans 4 blocks."""
    seed = fresh_seed()
    i = torch.randint(-3, 4, (2, 61, 2)).to(D)
    i[0, 2, 0], i[0, 41, 0], i[0, 50, 0] = 9.0, 9.0, 12.0  # blocks 0-10 run on step 2, tie at 41, then 50
    i[0, 6, 1], i[0, 23, 1] = 9.0, 10.0  # step 6 (mid block 1) holds the max through block 5
    i[1, 13, :] = 3.0  # ties with the random integers of later steps
    f = torch.full_like(i, 1000.0)
    m0 = torch.tensor([[9.0, 2.0], [3.0, -1.0]], dtype=D) if has_m0 else None  # ties with the runs' maxima
    _check_paths(i, f, m0, None, seed, monkeypatch, tol=1e-15, exact_forward=True)


@pytest.mark.parametrize("has_m0", [False, True])
def test_parallel_long_runs(has_m0, one_thread, monkeypatch):
    """Gates with F drifting down slowly: an early large ĩ stays the max over most of the sequence (one run across
    ~14 blocks and 7 pieces), another run starts mid-block; the 0 floor or m_0 wins at the start of the other
    head."""
    seed = fresh_seed()
    i, f = _gates(2, 61, 3)
    f += 3.0
    i[:, 3, 0] += 30.0
    i[:, 6, 1] += 12.0
    i[:, :20, 2] -= 40.0
    m0 = torch.randn(2, 3, dtype=D) * 3 if has_m0 else None
    _check_paths(i, f, m0, None, seed, monkeypatch)


# each tiling with m_0 or without (the default tiling and the widest with both)
@pytest.mark.parametrize("tiles,has_m0", [("4,1,4,2", True), ("4,1,4,2", False), ("4,2,4,2", False),
                                          ("8,4,4,4", True), ("8,4,4,4", False)])
def test_parallel_varlen(tiles, has_m0, one_thread, monkeypatch):
    """Packed sequences of 1 step, exactly one block, two blocks, many blocks (with a long run) and a few steps,
    with m_0 and without; blocks of a head block (BH = 2, 4 with H = 3: masked heads)."""
    seed = fresh_seed()
    lens = [1, 4, 8, 37, 3, 1]
    cu = torch.tensor([0] + lens).cumsum(0)
    T = int(cu[-1])
    i, f = _gates(1, T, 3, large=True)
    i[0, 16, :] += 80.0  # the 37-step sequence starts at 13: step 3 of it stays the max
    m0 = torch.randn(len(lens), 3, dtype=D) * 5 if has_m0 else None
    _check_paths(i, f, m0, cu, seed, monkeypatch, tiles=tiles)


def test_many_sequences_take_the_sequential_kernels(one_thread, monkeypatch):
    """Above PARALLEL_MAX_SEQ_HEADS sequences x heads the sequential kernels run (their programs are many and their
    walks short; a parallel program would search all of cu_seqlens for its block), with the same results."""
    from ula.ops import _mlstm_gate_kernels as kernels
    seed = fresh_seed()
    names = []
    real = kernels.launch
    monkeypatch.setattr(kernels, "launch", lambda k, *a, **kw: names.append(k.fn.__name__) or real(k, *a, **kw))
    monkeypatch.setattr(kernels, "PARALLEL_MAX_SEQ_HEADS", 5)  # 3 sequences x 2 heads: over it
    cu = torch.tensor([0, 5, 19, 40])
    i, f = _gates(1, 40, 2)
    _check(i, f, torch.randn(3, 2, dtype=D), cu, seed)
    assert names and all(n.endswith("_seq_kernel") for n in names), names
    names.clear()
    monkeypatch.setattr(kernels, "PARALLEL_MAX_SEQ_HEADS", 6)  # at it: the parallel kernels
    _check(i, f, None, cu, seed)
    assert names and not any(n.endswith("_seq_kernel") for n in names), names
