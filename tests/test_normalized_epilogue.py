"""The fused epilogue of normalized linear attention (ula/ops/_normalized_epilogue.py, Triton kernels) against its
PyTorch form in float64 (ula/ops/normalized.py: _epilogue_torch): output, last Z and C, and the gradients of o,
den, v, a, z0, c0 (through the output and the final Z, C); T not a multiple of the chunk, varlen, the clamp.
Also the fused L2 norm of q and k (ula/ops/_l2norm.py) against F.normalize."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import ula  # noqa: E402
import ula.ops._normalized_epilogue as epi  # noqa: E402
from ula.ops.normalized import _epilogue_torch  # noqa: E402
from helpers import fresh_seed, rel  # noqa: E402
from test_ops_refs import check, check_conditioned, compare, per_sequence, ref_normalized  # noqa: E402

H = 2


def _coef(kind):
    return {"float": 0.7, "zero": 0.0, "head": torch.randn(H, 1), "scalar": torch.randn(()).view(1)}[kind]


def _inputs(B, T, V, N, a, h0, den_scale=1.0):
    d = dict(o=torch.randn(B, T, H, V), den=torch.randn(B, T, H) * den_scale, v=torch.randn(B, T, H, V), a=a)
    if h0:
        d.update(z0=torch.randn(N, H, V), c0=torch.randn(N, H))
    return d


def _run(inp, cu=None, chunk=16, final=True, eps=1e-6, ref_float32=False):
    def fused(**x):
        return epi.normalized_epilogue(**{"z0": None, "c0": None, **x}, eps=eps, cu_seqlens=cu, final=final,
                                       chunk_size=chunk)

    def ref(**x):
        return _epilogue_torch(**{"z0": None, "c0": None, **x}, eps=eps, cu_seqlens=cu, final=final)

    return compare(fused, ref, inp, ref_float32=ref_float32)


@pytest.mark.parametrize("T, V, chunk, a, h0", [(37, 16, 16, "float", False), (37, 48, 16, "head", True),
                                                (300, 128, 64, "scalar", True), (45, 16, 16, "zero", True)])
def test_fused_epilogue(T, V, chunk, a, h0, one_thread):
    """da sums every step's terms into one number per head (or one in all): on some draws they cancel, and the
    float32 recurrence itself misses it by ~1e-5 (seed 3445870492 at T=300: 1.5e-5, the kernels 1.3e-4), so errors
    are held to the draw's conditioning (check_conditioned), as the ops' tests do."""
    seed = fresh_seed()
    errs, errs32 = _run(_inputs(2, T, V, 2, _coef(a), h0), chunk=chunk, ref_float32=True)
    check_conditioned(errs, errs32, f"seed {seed}")


def test_fused_epilogue_varlen(one_thread, monkeypatch):
    """Sequences of 17, 1 and 40 steps (a sequence of one step, chunks that end at sequence ends); the scan over
    a sequence's chunks in blocks of 2 chunks (several blocks, the last one partial)."""
    seed = fresh_seed()
    monkeypatch.setattr(epi, "_SCAN_BLOCK", 2)
    cu = torch.tensor([0, 17, 18, 58])
    check(_run(_inputs(1, 58, 6, 3, _coef("head"), True), cu=cu, chunk=8), seed)


def test_fused_epilogue_clamp(one_thread):
    """Denominators near 0 of both signs: the clamp keeps the sign (0 counts as positive) and passes no
    gradient where it acts."""
    seed = fresh_seed()
    inp = _inputs(2, 37, 16, 2, torch.rand(H, 1) * 1e-3, True)
    inp["den"] = torch.rand(2, 37, H) * 0.4 - 0.2
    inp["den"][0, :5] = 0.0
    inp["c0"] = inp["c0"].abs()
    den_ = inp["den"] + inp["a"].view(H) * (inp["c0"].view(2, 1, H) + torch.arange(1, 38).view(1, -1, 1))
    assert (den_.abs() < 0.1).float().mean() > 0.3 and (den_ < -0.1).any()
    check(_run(inp, eps=0.1), seed)


@pytest.mark.parametrize("path", ["triton", "torch"])
def test_epilogue_cancelling_denominator(path, one_thread):
    """den + a C near 0 by cancellation (|a C| up to ~60, the sum ~0.01-0.05): den + a C is summed in float64
    in both float32 paths, else rounding a C costs ~1e-4 in out and 2x that in dden, da, dc0 (1/d²). With it, over
    150 seeds: at most 2.5e-7 elementwise, 1.8e-6 for da and dc0."""
    seed = fresh_seed()
    a, c0 = torch.randn(H, 1) + 1.0, torch.randn(2, H) * 10
    inp = _inputs(2, 37, 48, 2, a, True)
    C = c0.view(2, 1, H).double() + torch.arange(1, 38).view(1, -1, 1)
    gap = (torch.rand(2, 37, H) * 0.04 + 0.01) * torch.randint(0, 2, (2, 37, H)).mul(2).sub(1)
    inp.update(c0=c0, den=(gap - a.view(H).double() * C).float())
    if path == "triton":
        errs = _run(inp)
    else:
        kw = dict(eps=1e-6, cu_seqlens=None, final=True)
        errs = compare(lambda **x: _epilogue_torch(**x, **kw), lambda **x: _epilogue_torch(**x, **kw), inp)
    sums = {k: errs.pop(k) for k in ("da", "dc0")}  # one number per head over 74 cancelling rows: a longer tail
    check(errs, seed, tol=1e-6)
    check(sums, seed, tol=2e-5)


def test_fused_epilogue_without_final(one_thread):
    """No final state: a = 0 (the number) skips v altogether (no gradient reaches v); a tensor a still
    works with Z_T unused."""
    seed = fresh_seed()
    inp = _inputs(2, 37, 16, 2, 0.0, False)
    v = inp.pop("v")
    kw = dict(z0=None, c0=None, eps=1e-6, cu_seqlens=None, final=False)
    errs = compare(lambda **x: epi.normalized_epilogue(**x, v=v, **kw),
                   lambda **x: _epilogue_torch(**x, v=v.double(), **kw), inp)
    check(errs, seed)
    check(_run(_inputs(2, 37, 16, 2, _coef("head"), True), final=False), seed)


def test_normalized_triton_varlen(one_thread, monkeypatch):
    """End to end on the Triton path with cu_seqlens, learnable a and b, an initial state; epilogue chunks of 16."""
    seed = fresh_seed()
    monkeypatch.setattr(epi, "CHUNK", 16)
    K, V = 8, 6
    cu = torch.tensor([0, 17, 18, 47])
    a, b = torch.rand(H) + 1.2, torch.rand(H)
    inp = dict(q=torch.randn(1, 47, H, K), k=torch.randn(1, 47, H, K), v=torch.randn(1, 47, H, V), a=a, b=b,
               h0=_state(3, K, V))
    errs = compare(lambda h0, **x: ula.normalized_linear_attention(**x, initial_state=h0, output_final_state=True,
                                                                   cu_seqlens=cu, chunk_size=16, backend="triton"),
                   lambda h0, a, b, **x: per_sequence(ref_normalized, cu, x, dict(a=a, b=b), h0), inp)
    # da, db: one number per head summed over all 47 steps, whose terms cancel; 60 seeds gave at most 5.4e-5 (da),
    # seed 923778867 gives 1.21e-4: held to 1e-3, as the suite's other sums of cancelling terms (test_extreme.py)
    sums = {k: errs.pop(k) for k in ("da", "db")}
    check(errs, seed)
    check(sums, seed, tol=1e-3)


@pytest.mark.parametrize("b", ["head", "float"])
def test_normalized_triton_wide_values(b, one_thread):
    """The fused path (ula/ops/_normalized_fused.py) with V over one tile of the output kernel (144 = 128 + 16: each
    V tile forms the denominator and divides by it), T not a multiple of the chunk, per-head a, b per head (q times
    b, the L2 norm's own kernels) or a float (the core's scale, the L2 norm's backward in the dQ and dK passes), an
    initial state and the final state."""
    seed = fresh_seed()
    K, V = 16, 144
    a, b = torch.rand(H) + 1.2, (torch.rand(H) * 2 - 1 if b == "head" else -0.7)
    inp = dict(q=torch.randn(2, 45, H, K), k=torch.randn(2, 45, H, K), v=torch.randn(2, 45, H, V), a=a, b=b,
               h0=_state(2, K, V))
    # judged against the float32 recurrence's own miss: da sums over every step and can cancel (seed 1075582242: da
    # 1.15e-4, the float32 recurrence 3.1e-5)
    op = lambda h0, **x: ula.normalized_linear_attention(  # noqa: E731
        **x, initial_state=h0, output_final_state=True, chunk_size=32, backend="triton")
    errs, errs32 = compare(op, lambda h0, **x: ref_normalized(**x, h0=h0), inp, ref_float32=True)
    check_conditioned(errs, errs32, f"seed {seed}")


@pytest.mark.parametrize("l2,a,tile", [(True, "float", None), (True, "fixed_head", "2048,4"),
                                       (False, "float", "1024,4"), (True, "learnable", "2048,4")])
def test_normalized_triton_row_blocks(l2, a, tile, one_thread, monkeypatch):
    """The fused path at chunks of 128 steps, two row blocks of the output kernel each (the tests elsewhere take
    chunks of 16 or 32: one block), a block past a sequence's end; varlen (sequences of 150 and 53 steps), an
    initial state with its count, the final state; a float a, or a per-head a without a gradient, or a learnable
    one. `tile` (elements, warps) of the division's backward: 2048 / 1024 elements of V = 32 make its loop over a
    chunk's rows take 2 / 4 steps (its sums carried across them)."""
    from ula.core.triton import utils
    seed = fresh_seed()
    monkeypatch.setattr(utils, "_TUNING", {"division_backward": tile} if tile else {})
    K, V = 16, 32  # multiples of 16: the fused path
    cu = torch.tensor([0, 150, 203])
    a_in = 1.3 if a == "float" else torch.rand(H) + 1.2
    inp = dict(q=torch.randn(1, 203, H, K), k=torch.randn(1, 203, H, K), v=torch.randn(1, 203, H, V),
               h0=_state(2, K, V))
    if a == "learnable":  # an input of compare: its gradient da is checked, and the division kernel forms it
        inp["a"] = a_in
    if not l2:  # positive features keep the denominator away from 0
        inp["q"], inp["k"] = inp["q"].abs(), inp["k"].abs()
    op = lambda h0, a=a_in, **x: ula.normalized_linear_attention(  # noqa: E731  (a: an input where learnable)
        **x, a=a, b=0.8, qk_l2_norm=l2, initial_state=h0, output_final_state=True, cu_seqlens=cu, chunk_size=128,
        backend="triton")
    ref = lambda h0, a=a_in, **x: per_sequence(ref_normalized, cu, x, dict(a=a, b=0.8, qk_l2_norm=l2), h0)  # noqa: E731
    errs, errs32 = compare(op, ref, inp, ref_float32=True)
    check_conditioned(errs, errs32, f"seed {seed}")


def test_normalized_triton_denominator_clamp(one_thread):
    """a = 0 without the L2 norm and a large eps on the fused path: denominators cross 0 and many are clamped to
    ±eps, where dden passes no gradient; against the reference with the same guard."""
    seed = fresh_seed()
    K, V = 16, 16
    inp = dict(q=torch.randn(2, 37, H, K) * 0.05, k=torch.randn(2, 37, H, K), v=torch.randn(2, 37, H, V))
    den = (inp["q"] * inp["k"].cumsum(1)).sum(-1)  # Σ_{s<=t} q_t·k_s
    assert 0.2 < (den.abs() < 0.5).float().mean() < 0.8  # the clamp acts on many steps, not on all
    errs = compare(lambda **x: ula.normalized_linear_attention(**x, a=0.0, b=1.0, qk_l2_norm=False, eps=0.5,
                                                               output_final_state=True, chunk_size=16,
                                                               backend="triton"),
                   lambda **x: ref_normalized(**x, a=0.0, b=1.0, qk_l2_norm=False, eps=0.5), inp)
    check(errs, seed)


def test_normalized_triton_norm_clamp(one_thread):
    """Rows of q and k under the L2 norm's eps (a zero row, a row of 1e-14, rows of norm eps / 2) on the fused path
    with a float b: there x / max(|x|, eps) has no projection term in its gradient (as F.normalize's), and the dQ
    and dK passes must agree with the reference at those rows too (gradients ~1e12 there). At norm eps / 2 the
    projection would be 25% of the row's gradient (a zero row hides it: y = 0); q's sign flag for it is stored by
    the output kernel, k's by the L2 pass. The reference takes F.normalize's eps (test_ops_refs' own norm has none)."""
    seed = fresh_seed()
    K, V = 16, 16
    q, k = torch.randn(2, 37, H, K), torch.randn(2, 37, H, K)
    q[0, 3, 1] = 0.0
    k[1, 5, 0] = 1e-14
    q[1, 20, 0] = 0.5e-12 * F.normalize(torch.randn(K), dim=0)
    k[0, 30, 1] = 0.5e-12 * F.normalize(torch.randn(K), dim=0)
    inp = dict(q=q, k=k, v=torch.randn(2, 37, H, V), a=1.5, b=0.8)
    errs = compare(lambda **x: ula.normalized_linear_attention(**x, output_final_state=True, chunk_size=16,
                                                               backend="triton"),
                   lambda q, k, **x: ref_normalized(F.normalize(q, dim=-1), F.normalize(k, dim=-1), **x,
                                                    qk_l2_norm=False), inp)
    check(errs, seed)


def _state(N, K, V):
    """A state that a prefix could have left: Σ [k; 1][v; 1]ᵀ over 6 random tokens (L2-normalized keys)."""
    k = torch.nn.functional.normalize(torch.randn(N, 6, H, K), dim=-1)
    v = torch.randn(N, 6, H, V)
    ka = torch.cat([k, torch.ones_like(k[..., :1])], -1)
    va = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    return torch.einsum("nthk,nthv->nhkv", ka, va)


def test_fused_l2_norm(one_thread):
    """Forward and backward against F.normalize in float64: D not a power of two, a zero row and a row under eps
    (where F.normalize's gradient drops the norm's term), rows not a multiple of the kernel's block."""
    import torch.nn.functional as F
    from ula.ops._l2norm import l2_normalize
    seed = fresh_seed()
    q, k = torch.randn(2, 37, H, 24), torch.randn(2, 37, H, 24) * 3
    q[0, 3, 1] = 0.0
    k[1, 5, 0] = 1e-14
    gq, gk = torch.randn_like(q, dtype=torch.float64), torch.randn_like(k, dtype=torch.float64)
    errs = {}
    for name, fn, dt in (("fused", l2_normalize, torch.float32),
                         ("ref", lambda q, k: (F.normalize(q, dim=-1), F.normalize(k, dim=-1)), torch.float64)):
        x = [t.detach().to(dt).clone().requires_grad_() for t in (q, k)]
        yq, yk = fn(*x)
        ((yq.double() * gq).sum() + (yk.double() * gk).sum()).backward()
        errs[name] = (yq, yk, x[0].grad, x[1].grad)
    check({n: rel(a, b) for n, a, b in zip(("q", "k", "dq", "dk"), errs["fused"], errs["ref"])}, seed)


def test_unit_one_with_inverse(one_thread):
    """The fused forward's L2 norm of k (ula/ops/_l2norm.py unit_one): the normalized rows and r = 1 / max(|x|, eps)
    against F.normalize in float64, rows not a multiple of the block, D not a power of two, a zero row (r negative
    there: no projection term in the backward)."""
    from ula.ops._l2norm import unit_one
    seed = fresh_seed()
    q, k = torch.randn(2, 37, H, 24), torch.randn(2, 37, H, 24) * 3
    q[0, 3, 1] = 0.0
    (qn, rq), (kn, rk) = unit_one(q), unit_one(k)
    errs = {}
    for name, x, y, r in (("q", q, qn, rq), ("k", k, kn, rk)):
        x64 = x.double()
        errs[name] = rel(y, F.normalize(x64, dim=-1))
        norm = x64.norm(dim=-1)
        want = torch.where(norm >= 1e-12, 1 / norm.clamp_min(1e-12), -1 / norm.clamp_min(1e-12))
        errs["r" + name] = rel(r, want)
    assert rq[0, 3, 1] < 0 and torch.isfinite(rq).all()
    check(errs, seed)


@pytest.mark.parametrize("dot", ["f32", "bf16"])
@pytest.mark.parametrize("varlen,z0", [(False, False), (False, True), (True, True)])
def test_state_call_sums_v(one_thread, dot, varlen, z0, monkeypatch):
    """The forward state call's sums of v (chunk_states' v_sums: normalized attention's a part, the state of a
    constant key 1): z0 + Σ v over the earlier chunks of each sequence, stored before each chunk ([B * chunks, H, V]
    as the output kernel reads it), and the total, against float64 sums; T not a multiple of the chunk, two row
    blocks per chunk, varlen (chunks restart at each sequence), bfloat16 matmuls (emulated: the sums as a matmul
    against a column of ones, exact for bfloat16 values) and float32 (a row sum)."""
    from ula.core.triton.chunk import make_layout
    from ula.core.triton.state import chunk_states
    from ula.core.triton import utils
    from ula.core.triton.utils import DOT_BF16_EMULATED, DOT_F32
    seed = fresh_seed()
    K, V, C = 40, 24, 32  # K in three tiles: each keeps the sums, the first stores them
    B, T, cu = (1, 83, torch.tensor([0, 19, 20, 83])) if varlen else (2, 77, None)
    N = B if cu is None else cu.numel() - 1
    rb = lambda x: x.bfloat16().float()  # noqa: E731  (values a bfloat16 model holds)
    k, v = rb(torch.randn(B, T, H, K)), rb(torch.randn(B, T, H, V))
    zinit = torch.randn(N, H, V) if z0 else None
    layout = make_layout(B, T, C, cu, k.device)
    # two row blocks of a chunk, V in two tiles (the last partial)
    monkeypatch.setattr(utils, "_TUNING", {"state": "16,16,16,4"})
    out = chunk_states(k, v, None, None, None, layout, False, DOT_BF16_EMULATED if dot == "bf16" else DOT_F32,
                       ones=True, v_sums=True, z0=zinit)
    carry, total = out[4]
    starts = [0] if cu is None else cu[:-1].tolist()
    ends = [T] if cu is None else cu[1:].tolist()
    want, want_total = [], []
    for b in range(B):
        for i, (s0, e0) in enumerate(zip(starts, ends)):
            z = torch.zeros(H, V, dtype=torch.float64) if zinit is None else zinit[b + i].double()
            for c0 in range(s0, e0, C):
                want.append(z)
                z = z + v[b, c0:min(c0 + C, e0)].double().sum(0)
            want_total.append(z)
    check({"carry": rel(carry, torch.stack(want)), "total": rel(total, torch.stack(want_total))}, seed)
