"""The Triton backend (ula/core/triton) against autograd through the float64 reference: forward and every
gradient (the backward calls the same kernels with roles swapped), every decay kind, right decay, odd lengths,
K != V (non-powers of two by masking), chunk sizes 16..256, both directions, states, varlen, float32/float16.
Without a GPU the kernels run through Triton's interpreter (tests/conftest.py), so shapes stay small."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import ula  # noqa: E402
from helpers import (DEVICE, KINDS, compare_with_reference, constant_decay_error, emulated_bf16_errors,  # noqa: E402
                     fresh_seed, log_decay, make_inputs, record_launches, rel)
from ula.core.autograd import canonical_left  # noqa: E402
from ula.core.chunk_torch import chunk_recurrence  # noqa: E402
from ula.core.reference import reference_linear_attention  # noqa: E402
from ula.core.triton import chunk_recurrence_triton  # noqa: E402

TOL32, TOL16 = 1e-4, 1e-2


def _check(errs, seed, tol=TOL32):
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= tol}
    assert not bad, f"relative errors over {tol}: {bad} (seed {seed})"


def _triton(chunk):
    return lambda *a, **kw: ula.linear_attention(*a, chunk_size=chunk, backend="triton", **kw)


def _on(inputs, dtype=None):
    out = []
    for i, x in enumerate(inputs):
        if x is not None:
            x = x.to(DEVICE)
            if dtype is not None and i < 3:
                x = x.to(dtype)
        out.append(x)
    return tuple(out)


# (T, chunk, K, V, reverse): odd lengths, K != V (V = 24 is padded to 32 on this path), both directions, chunk
# 16/32/64, a single value column
CASES = [(37, 16, 16, 24, False), (100, 32, 32, 12, True), (1, 64, 16, 16, True), (100, 64, 16, 24, False),
         (37, 16, 16, 1, True)]




def _pairs(names, rows):
    """pytest params: `rows` of values for the comma-separated `names`, with readable ids."""
    keys = names.split(",")
    return pytest.mark.parametrize(names, rows, ids=["-".join(_id(k, x) for k, x in zip(keys, row)) for row in rows])


_FLAGS = {"right": ("left", "right"), "reverse": ("fwd", "rev"), "varlen": ("batch", "varlen")}


def _id(name, x):
    if name == "case":
        return "T{}-C{}-K{}-V{}-{}".format(*x[:4], "rev" if x[4] else "fwd")
    return _FLAGS[name][x] if name in _FLAGS else str(x)


# Every kind with every case, right decay on in half of them (pairwise: each kind and each case has it on and off;
# the whole product doubled the suite's slowest test for no pair the halves miss)
@_pairs("kind,right,case", [(kind, (i + j) % 2 == 1, case) for i, kind in enumerate(KINDS)
                            for j, case in enumerate(CASES)])
def test_forward_and_gradients(kind, right, case):
    T, chunk, K, V, reverse = case
    seed = fresh_seed()
    inputs = _on(make_inputs(kind, right, 2, T, 2, K, V))
    _check(compare_with_reference(_triton(chunk), inputs, reverse=reverse), seed)


# (kind, right decay, K, V, reverse, varlen): per-feature decays over more than 256 features, which the kernels once
# dropped silently (K = 300 with a vector decay: o 38% off; V = 257: dq 11% off); the call now runs in blocks of 256
@pytest.mark.parametrize("kind,right,K,V,reverse,varlen", [
    ("vector", False, 272, 17, False, False), ("vector", False, 3, 257, True, False),
    ("none", True, 257, 5, False, True), ("scalar", True, 9, 300, False, False),
    ("vector", True, 260, 258, True, False)])
def test_decayed_widths_over_256(kind, right, K, V, reverse, varlen):
    seed = fresh_seed()
    T = 37
    # (one batch row: the widths are the point)
    inputs = _on(make_inputs(kind, right, 1, T, 1, K, V, N=3 if varlen else None))
    kw = dict(cu_seqlens=torch.tensor([0, 5, 21, T], device=DEVICE)) if varlen else {}
    _check(compare_with_reference(_triton(16), inputs, reverse=reverse, **kw), seed)


@pytest.mark.parametrize("kind,reverse", [("scalar", False), ("constant", True)])
def test_transposed_q_with_right_decay(kind, reverse):
    """q a transposed view of a [B, H, T, K] tensor, with a decay per step and a right decay: the left decay's
    gradient, formed from q ⊙ dq on the host in q's layout, was read as [B, T, H] rows (d ld 16x off)."""
    seed = fresh_seed()
    q, k, v, ld, rd, h0 = _on(make_inputs(kind, True, 2, 21, 2, 16, 16))
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # the same values in [B, H, T, K] storage
    assert not q.is_contiguous()
    _check(compare_with_reference(_triton(16), (q, k, v, ld, rd, h0), reverse=reverse), seed)


@pytest.mark.parametrize("right", [False, True])
def test_h200_state_tiles(monkeypatch, right):
    """The state kernel's K tiles of 32 that an H200 takes for decays per feature (`narrow_on_h200`, forced here):
    K = 128 walked as four tiles of 32 (two otherwise), against the float64 reference, forward and gradients."""
    from ula.core.triton import state
    monkeypatch.setattr(state, "narrow_on_h200", lambda *args: True)
    tiles = record_launches(monkeypatch, lambda kernel, w, cx, s: cx["BK"] if kernel is state._state_kernel else None)
    seed = fresh_seed()
    inputs = _on(make_inputs("vector", right, 1, 41, 2, 128, 80))
    _check(compare_with_reference(_triton(16), inputs, reverse=right), seed)
    assert tiles and set(tiles) == {32}, tiles


def test_h200_state_tiles_choice(monkeypatch):
    """Which state calls take them: tf32 matmuls (GLA's default precision), decays per feature, no split along T,
    between sms / 2 and sms programs, on an H200; B2 H16 K=V=128 has 128 programs on 132 multiprocessors."""
    from ula.core import backends
    from ula.core.triton import state, utils
    assert not backends.is_h200(torch.device("cpu"))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(state, "is_h200", lambda device: True)
    pick = state.narrow_on_h200
    assert pick(utils.DOT_TF32, True, 1, 128, 132, cuda)
    assert pick(utils.DOT_TF32, True, 1, 67, 132, cuda) and not pick(utils.DOT_TF32, True, 1, 66, 132, cuda)
    assert not pick(utils.DOT_TF32, True, 1, 133, 132, cuda)
    assert not pick(utils.DOT_BF16, True, 1, 128, 132, cuda)  # HGRN2's bfloat16 matmuls: slower narrowed
    assert not pick(utils.DOT_TF32, False, 1, 128, 132, cuda)
    assert not pick(utils.DOT_TF32, True, 2, 128, 132, cuda)
    monkeypatch.setattr(state, "is_h200", lambda device: False)
    assert not pick(utils.DOT_TF32, True, 1, 128, 132, cuda)


@pytest.mark.parametrize("kind,chunk", [("scalar", 128), ("scalar", 256), ("vector", 128), ("vector", 256),
                                        ("scalar", 512)])
def test_large_chunks_tiled(kind, chunk):
    """Chunks larger than one tile: the intra-chunk matrix is walked in key blocks; at 512 the state kernel
    loops over more than two row blocks (not unrolled)."""
    seed = fresh_seed()
    inputs = _on(make_inputs(kind, kind == "vector", 1, 700 if chunk > 256 else 300, 1, 16, 16))
    _check(compare_with_reference(_triton(chunk), inputs, reverse=chunk == 256), seed)


# each kind left and right, forward and reverse; each (right, reverse) pair with two kinds
@_pairs("kind,right,reverse", [(kind, right, right == (i % 2 == 0)) for i, kind in enumerate(KINDS)
                               for right in (False, True)])
def test_varlen(kind, right, reverse):
    seed = fresh_seed()
    lens = torch.randint(1, 50, (3,))
    lens[0] = 17  # never all equal
    lens[1] = 33
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    T = int(cu[-1])
    inputs = _on(make_inputs(kind, right, 1, T, 2, 16, 12, N=3))
    _check(compare_with_reference(_triton(16), inputs, cu_seqlens=cu.to(DEVICE), reverse=reverse), seed)


@pytest.mark.parametrize("kind", KINDS)
def test_without_states(kind):
    seed = fresh_seed()
    inputs = _on(make_inputs(kind, False, 2, 45, 2, 16, 16, h0=False))
    _check(compare_with_reference(_triton(32), inputs, final=False), seed)


@_pairs("kind,right", [(kind, i % 2 == 1) for i, kind in enumerate(KINDS)])
def test_float16(kind, right):
    seed = fresh_seed()
    inputs = _on(make_inputs(kind, right, 1, 70, 2, 16, 24), torch.float16)
    _check(compare_with_reference(_triton(32), inputs, reverse=kind == "scalar"), seed, TOL16)


def test_bfloat16_runs():
    seed = fresh_seed()
    inputs = _on(make_inputs("vector", True, 1, 40, 1, 16, 16), torch.bfloat16)
    errs = compare_with_reference(_triton(16), inputs)
    _check({k: v for k, v in errs.items() if k == "o"}, seed, 2e-2)


def test_extreme_decays_stay_finite():
    """Log decays from 0 down to -1e4 per step: no inf or NaN, and equal to the reference."""
    seed = fresh_seed()
    q, k, v, _, _, s0 = make_inputs("none", False, 1, 77, 1, 16, 16)
    ld = -torch.rand(1, 77, 1, 16) * 1e4 * (torch.rand(1, 77, 1, 16) < 0.3)
    ld[:, :5] = 0.0
    rd = -torch.rand(1, 77, 1, 16) * 1e4 * (torch.rand(1, 77, 1, 16) < 0.1)
    _check(compare_with_reference(_triton(16), _on((q, k, v, ld, rd, s0))), seed)


def test_noncontiguous_inputs():
    seed = fresh_seed()
    q, k, v, ld, rd, s0 = make_inputs("vector", False, 1, 33, 2, 16, 16)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not q.is_contiguous()
    _check(compare_with_reference(_triton(16), _on((q, k, v, ld, rd, s0))), seed)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("kind", KINDS)
def test_direct_call_border_states(kind, reverse, varlen):
    """chunk_recurrence_triton itself: border states equal the PyTorch chunk path's, o and the final state equal
    the float64 reference."""
    seed = fresh_seed()
    B, T = (1, 53) if varlen else (2, 40)
    cu = torch.tensor([0, 17, 50, 53]) if varlen else None
    q, k, v, ld, rd, s0 = make_inputs(kind, True, B, T, 2, 16, 24, N=3 if varlen else None)
    gl = canonical_left(ld, T)
    scale = 0.3
    args = _on((q, k, v, gl, rd, s0))
    cu_d = None if cu is None else cu.to(DEVICE)
    o, S, border = chunk_recurrence_triton(*args[:5], scale=scale, initial_state=args[5], cu_seqlens=cu_d,
                                           reverse=reverse, chunk_size=16)
    o_t, S_t, border_t = chunk_recurrence(q, k, v, gl, rd, scale=scale, initial_state=s0, cu_seqlens=cu,
                                          reverse=reverse, chunk_size=16)
    assert o.dtype == S.dtype == border.dtype == torch.float32
    assert border.shape == border_t.shape
    err = ((border.cpu().double() - border_t.double()).norm() / border_t.double().norm()).item()
    assert err <= TOL32, f"border states: {err:.2e} (seed {seed})"
    o_ref, S_ref = reference_linear_attention(*(None if x is None else x.double() for x in (q, k, v, ld, rd)),
                                              scale=scale, initial_state=s0.double(), output_final_state=True,
                                              cu_seqlens=cu, reverse=reverse)
    for name, x, ref in (("o", o, o_ref), ("final", S, S_ref)):
        e = ((x.cpu().double() - ref).norm() / ref.norm()).item()
        assert e <= TOL32, f"{name}: {e:.2e} (seed {seed})"


def test_expanded_constant_decay_and_scalar_right_decay():
    """A constant decay arrives as an expanded [1, T, H, 1] view; a trailing-1 right decay moves to the left."""
    seed = fresh_seed()
    q, k, v, _, _, s0 = make_inputs("none", False, 2, 30, 2, 16, 16)
    ld = torch.nn.functional.logsigmoid(torch.randn(2) + 2)
    gl = canonical_left(ld, 30)
    gr = torch.nn.functional.logsigmoid(torch.randn(2, 30, 2, 1) + 3)
    for reverse in (False, True):
        args = _on((q, k, v, gl, gr, s0))
        o, S, _ = chunk_recurrence_triton(*args[:5], initial_state=args[5], reverse=reverse, chunk_size=16)
        o_t, S_t, _ = chunk_recurrence(q, k, v, gl, gr, initial_state=s0, reverse=reverse, chunk_size=16)
        for x, ref in ((o, o_t), (S, S_t)):
            e = ((x.cpu().double() - ref.double()).norm() / ref.double().norm()).item()
            assert e <= TOL32, f"{e:.2e} (seed {seed}, reverse {reverse})"


# the torch backend with every combination; Triton with each kind forward and reverse, batch and varlen
@_pairs("kind,reverse,varlen,backend",
        [(kind, rev, varlen, "torch") for kind in KINDS for rev in (False, True) for varlen in (False, True)]
        + [(kind, rev, rev == (i % 2 == 0), "triton") for i, kind in enumerate(KINDS) for rev in (False, True)])
def test_key_gate(kind, reverse, varlen, backend):
    """key_gate u: k_t enters as exp(u_t) k_t. Against the float64 reference on exp(u) k (autograd through the
    product gives u's gradient); the Triton path applies u inside its kernels (rows of dK/dV, sources elsewhere)."""
    seed = fresh_seed()
    B, T, H, K, V = (1, 90, 2, 16, 24) if varlen else (2, 45, 2, 16, 24)
    cu = torch.tensor([0, 7, 40, 90]) if varlen else None
    N = 3 if varlen else B
    q, k, v, ld, _, _ = make_inputs(kind, False, B, T, H, K, V)
    u = torch.randn(B, T, H) - 0.5
    h0 = torch.randn(N, H, K, V)
    leaves = [x for x in (q, k, v, ld, u, h0) if x is not None]
    ours = [x.detach().clone().to(DEVICE).requires_grad_() for x in leaves]
    refs = [x.detach().double().requires_grad_() for x in leaves]

    def unpack(xs):
        it = iter(xs)
        q_, k_, v_ = next(it), next(it), next(it)
        ld_ = next(it) if ld is not None else None
        return q_, k_, v_, ld_, next(it), next(it)

    q1, k1, v1, ld1, u1, h1 = unpack(ours)
    o, S = ula.linear_attention(q1, k1, v1, ld1, key_gate=u1, initial_state=h1, output_final_state=True,
                                cu_seqlens=cu, reverse=reverse, chunk_size=16, backend=backend, scale=0.7)
    q2, k2, v2, ld2, u2, h2 = unpack(refs)
    o_ref, S_ref = reference_linear_attention(q2, k2 * u2.exp().unsqueeze(-1), v2, ld2, initial_state=h2,
                                              output_final_state=True, cu_seqlens=cu, reverse=reverse, scale=0.7)
    do, dS = torch.randn_like(o_ref), torch.randn_like(S_ref)
    ((o.double().cpu() * do).sum() + (S.double().cpu() * dS).sum()).backward()
    ((o_ref * do).sum() + (S_ref * dS).sum()).backward()
    errs = {"o": rel(o, o_ref), "S": rel(S, S_ref)}
    for name, a, b in zip(["q", "k", "v"] + (["ld"] if ld is not None else []) + ["key_gate", "h0"], ours, refs):
        errs["d" + name] = rel(a.grad, b.grad)
    if kind == "constant":  # k2 ⊙ dk2 = (k2 e^u) ⊙ d(k2 e^u): the gated key's terms
        errs["dld"] = constant_decay_error(ours[3].grad, ld2.grad, q2, q2.grad, k2, k2.grad)
    _check(errs, seed)


def test_key_gate_reference_backend_half_precision():
    """backend="reference" with bfloat16 inputs and a key gate: the gate is folded into k in float32 after the
    checks (a wide k beside bfloat16 q failed the dtype check); within bf16 output rounding of the float64 call."""
    seed = fresh_seed()
    q, k, v = (torch.randn(1, 20, 2, 16).bfloat16() for _ in range(3))
    u = torch.randn(1, 20, 2) - 0.5
    o, _ = ula.linear_attention(q, k, v, key_gate=u, backend="reference")
    o64, _ = reference_linear_attention(q.double(), k.double() * u.double().exp().unsqueeze(-1), v.double())
    assert o.dtype == torch.bfloat16 and rel(o, o64) < 4e-3, (seed, rel(o, o64))


@pytest.mark.parametrize("K,V", [(16, 24), (129, 12), (8, 200)])
@pytest.mark.parametrize("decay", ["none", "per-head", "per-sequence", "per-feature", "right"])
def test_fused_step(decay, K, V):
    """The decoding step kernel (ula/core/triton/step.py, what `*_step` runs on CUDA without gradients) against
    one step of the float64 reference, with and without a state, and in place; K, V not powers of two, V over
    one slab."""
    from ula.core.triton.step import recurrent_step_triton
    seed = fresh_seed()
    B, H = 3, 2
    q, k = torch.randn(B, H, K), torch.randn(B, H, K)
    v = torch.randn(B, H, V)
    g = lambda *s: torch.nn.functional.logsigmoid(torch.randn(*s) + 2.0)  # noqa: E731
    ld = {"none": None, "per-head": g(H), "per-sequence": g(B, H), "per-feature": g(B, H, K), "right": g(B, H, K)}
    ld = ld[decay]
    rd = g(B, H, V) if decay == "right" else None
    h0 = torch.randn(B, H, K, V)
    for state, in_place in ((None, False), (h0, False), (h0, True)):
        args = _on((q, k, v, ld, rd, state))
        buf = args[5].clone() if in_place else None  # the new state written over the old (step_static's buffers)
        o, S = recurrent_step_triton(*args[:5], buf if in_place else args[5], 0.7, out=buf)
        assert not in_place or S.data_ptr() == buf.data_ptr()
        ld_ref = None if ld is None else (ld if ld.dim() == 1 else ld.unsqueeze(1))  # one time step
        o_ref, S_ref = reference_linear_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), ld_ref,
                                                  None if rd is None else rd.unsqueeze(1), scale=0.7,
                                                  initial_state=state, output_final_state=True)
        assert S.dtype == torch.float32 and o.dtype == v.dtype
        _check({"o": rel(o, o_ref[:, 0]), "S": rel(S, S_ref)}, seed)


def test_launch_falls_back_to_fewer_stages_where_shared_memory_is_short(monkeypatch):
    """A GPU with less shared memory than the H100 the tiles were chosen on (an A100 for float32 inputs): the
    launch retries with fewer pipeline stages; where even one stage does not fit, a clear error says what to do."""
    from triton.runtime.errors import OutOfResources

    from ula.core.triton.utils import launch

    class FakeKernel:
        def __init__(self, fits_at):
            self.fits_at, self.tried = fits_at, []
            self.fn = type("fn", (), {"__name__": "_fake_kernel"})

        def __getitem__(self, grid):
            def call(*args, num_warps, num_stages=None, **constexprs):
                self.tried.append(num_stages)
                if num_stages not in self.fits_at:
                    raise OutOfResources(200_000, 166_912, "shared memory")
            return call

    from ula.core.triton import utils
    monkeypatch.setattr(utils, "INTERPRET", True)  # the uncached path (a GPU caches the compiled launch)
    k = FakeKernel(fits_at=(1,))
    launch(k, (1,), 1.0, num_warps=4, X=1)
    assert k.tried == [None, 2, 1]
    k = FakeKernel(fits_at=(None,))
    launch(k, (1,), 1.0, num_warps=4, X=1)
    assert k.tried == [None]
    with pytest.raises(RuntimeError, match="smaller chunk_size"):
        launch(FakeKernel(fits_at=()), (1,), 1.0, num_warps=4, X=1)
    k = FakeKernel(fits_at=(2,))  # preferences tried in turn (the state kernel's 4 stages first)
    launch(k, (1,), 1.0, num_warps=4, num_stages=(4, None, 2, 1), X=1)
    assert k.tried == [4, None, 2]


@pytest.mark.parametrize("hopper", [True, False], ids=["sm90", "other_gpu"])
@pytest.mark.parametrize("kind", ["none", "scalar"])
def test_state_stages_preferred_without_decay(monkeypatch, kind, hopper):
    """The state kernel asks for 4 pipelining stages first where no decay or gate enters its loop (measured faster
    there on the H100 / H200, slower with decays: RESULTS.md session 22) and leaves Triton's default otherwise,
    and on GPUs other than those (an A100 spills 6 KB per thread at 4: RESULTS.md session 27); results as the
    reference's either way."""
    from ula.core.triton import state
    monkeypatch.setattr(state, "tuned_here", lambda device: hopper)

    def stages(kernel, w, cx, s):
        return (s,) if kernel.fn.__name__ == "_state_kernel" else None
    seen = record_launches(monkeypatch, stages)
    seed = fresh_seed()
    _check(compare_with_reference(_triton(16), _on(make_inputs(kind, False, 1, 45, 2, 16, 16))), seed)
    assert seen and set(seen) == ({((4, None, 2, 1),)} if kind == "none" and hopper else {(None,)}), seen


@pytest.mark.parametrize("capability, want", [((9, 0), True), ((8, 0), False), ((8, 9), False), ((10, 0), False)])
def test_tuned_here_is_hopper_or_off_cuda(monkeypatch, capability, want):
    """Choices measured on the H100 / H200 apply on compute capability 9.x, and off CUDA (the interpreter, and the
    offline compile's recording for sm_90); asked once per GPU."""
    from ula.core import backends
    from ula.core.triton import utils
    asked = []
    monkeypatch.setattr(backends, "_CAPABILITY", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: asked.append(d) or capability)
    assert utils.tuned_here(torch.device("cpu"))
    assert [utils.tuned_here(torch.device("cuda", 3)) for _ in range(2)] == [want, want] and len(asked) == 1


def test_bf16_emulation_rounds_matmul_operands():
    """ULA_EMULATE_BF16=1 (a precision study tool, benchmarks/cpu_bf16_error.py): the interpreter rounds matmul
    operands to bfloat16, so float32 inputs miss float64 by a bf16-sized error, not a float32-sized one."""
    errs = emulated_bf16_errors("--op", "scalar", "--shape", "1,40,1,16,16")  # o dq dk dv dg
    assert len(errs) == 5 and all(3e-4 < e < 3e-2 for e in errs.values()), errs


@pytest.mark.parametrize("right", [False, True], ids=["left", "right"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_vector_own_block_both_paths(right, reverse):
    """Decays per feature: the rows' own block goes through one reference step where its log decays span at most
    60 (output.py OWN_RANGE) and by levels elsewhere. Strong decays (~ -7 per step: a 16-step block spans ~110) in
    the first half of the sequence and mild ones after put both paths in one call, in every pass of the backward."""
    seed = fresh_seed()
    q, k, v, ld, rd, s0 = make_inputs("vector", right, 1, 75, 2, 16, 24)
    ld[:, :37] = log_decay((1, 37, 2, 16), strength=-7.0)
    if right:
        rd[:, 20:50] = log_decay((1, 30, 2, 24), strength=-7.0)
    _check(compare_with_reference(_triton(16), _on((q, k, v, ld, rd, s0)), reverse=reverse), seed)


def test_tuned_stages_reach_the_launch(monkeypatch):
    """A fifth value in ULA_TUNE_OUTPUT / ULA_TUNE_STATE ("BT,BK,BV,warps,stages") sets the software pipelining's
    stages of those launches (the lever against per-call differences of pipelined tl.dot loops, RESULTS.md session
    13); the results stay those of the reference."""
    from ula.core.triton import utils
    seen = record_launches(monkeypatch, lambda kernel, w, cx, s: (kernel.fn.__name__, w, s))
    monkeypatch.setattr(utils, "_TUNING", {"output": "64,64,64,4,1", "state": "64,64,64,4,2"})
    assert utils.stages_of("output", 4) == 1 and utils.stages_of("state", 4) == 2 and utils.stages_of("x", 4) is None
    seed = fresh_seed()
    inputs = _on(make_inputs("scalar", False, 1, 70, 2, 16, 16))
    _check(compare_with_reference(_triton(16), inputs), seed)
    assert {s for n, w, s in seen if n == "_output_kernel"} == {1}, seen
    assert {s for n, w, s in seen if n == "_state_kernel"} == {2}, seen


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "custom_op"])
def test_kept_output_carries_its_gradient(compiled):
    """With a right decay and v narrower than the compute dtype (bfloat16 beside float32 q, k here) the core also
    returns o in float32 (GSA's first pass reads it); a loss through both it and o gets the gradients of the sum of
    their cotangents, on the eager Function and on the custom op that torch.compile traces (called directly here).
    With v in float32 the output is that o and nothing is kept beside it (no copy)."""
    from ula.core import op
    call = op.linear_attention_fwd if compiled else op._Eager.apply  # what op.run picks while compiling, or not
    seed = fresh_seed()
    q, k, v, _, rd, h0 = make_inputs("none", True, 1, 37, 2, 16, 16, device=DEVICE)
    v = v.bfloat16().float()  # bf16 values: the reference sees what the kernels read
    leaves = [x.clone().requires_grad_() for x in (q, k, v.bfloat16(), rd)]
    out, _, kept = call(*leaves[:3], None, leaves[3], h0, None, 16 ** -0.5, False, 16, "triton", None, "")
    assert out.dtype == torch.bfloat16 and kept.shape == out.shape and kept.dtype == torch.float32
    a, b = torch.randn_like(kept), torch.randn_like(kept)
    ((out.float() * a).sum() + (kept * b).sum()).backward()
    ref = [x.double().clone().requires_grad_() for x in (q, k, v, rd)]
    o_r, _ = reference_linear_attention(*ref[:3], None, ref[3], scale=16 ** -0.5, initial_state=h0.double())
    (o_r * (a + b).double().cpu()).sum().backward()  # the reference runs on the CPU
    # float32 tiles under the interpreter; a GPU's matmuls take bf16 operands once v is bf16 (utils.dot_code)
    _check({"kept": rel(kept, o_r)}, seed, TOL32 if DEVICE == "cpu" else TOL16)
    # o stored in bfloat16, and so its gradient (a rounded) and dv
    _check({"o": rel(out, o_r), **{f"d{n}": rel(x.grad, r.grad) for n, x, r in zip("qkvr", leaves, ref)}}, seed, TOL16)
    out32, _, kept32 = call(q, k, v, None, rd, h0, None, 16 ** -0.5, False, 16, "triton", None, "")
    assert kept32.numel() == 0 and op.o_for_grad(out32, kept32, rd) is out32


def test_launch_key_tells_types_and_alignment_apart():
    """The compiled-launch cache's key: 1, 1.0 and True (equal in Python, three signatures to Triton) and tensors of
    other dtype or 16-byte alignment give other keys; equal arguments give the same key."""
    from ula.core.triton.utils import launch_key
    buf = torch.zeros(16)
    key = lambda *args, **cx: launch_key(launch_key, 0, 4, None, cx, args)  # noqa: E731  (any object as the kernel)
    assert len({key(1), key(1.0), key(True)}) == 3
    assert key(buf, 7, 0.5, X=2) == key(torch.ones(16), 7, 0.5, X=2)
    assert len({key(buf), key(buf[1:]), key(buf.double())}) == 3
    assert key(1, X=1) != key(1, X=2)


def test_compiled_launch_path_reuses_its_kernel(monkeypatch):
    """The compiled path of utils.launch (a GPU's, faked here): the first launch of a key goes through Triton's
    own path and keeps its compiled kernel; the next launch with the same key calls that kernel directly with the
    grid, the arguments and the constexprs in order; 1.0 in place of 1 is another key, so another compile."""
    from ula.core.triton import utils
    monkeypatch.setattr(utils, "INTERPRET", False)
    monkeypatch.setattr(utils, "_LAUNCHES", {})
    monkeypatch.setattr(utils.knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(utils, "_current_stream", lambda dev: "stream")
    runs, compiles = [], []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def run(self, *a):
            runs.append(a)

    class FakeKernel:
        arg_names = ["x", "n", "BLOCK", "FLAG"]
        fn = type("fn", (), {"__name__": "_fake_kernel"})

        def __getitem__(self, grid):
            def call(*args, num_warps, **kw):
                compiles.append((grid, args, kw.get("BLOCK"), kw.get("FLAG")))
                return Compiled()
            return call

    k, buf = FakeKernel(), torch.zeros(16)
    utils.launch(k, (3,), buf, 1, num_warps=4, BLOCK=64, FLAG=True)
    utils.launch(k, (5, 2), buf, 1, num_warps=4, BLOCK=64, FLAG=True)
    assert len(compiles) == 1 and len(runs) == 1
    assert runs[0][:6] == (5, 2, 1, "stream", "fn", "meta") and runs[0][9:] == (buf, 1, 64, True), runs[0]
    utils.launch(k, (3,), buf, 1.0, num_warps=4, BLOCK=64, FLAG=True)
    assert len(compiles) == 2 and len(runs) == 1


@pytest.mark.parametrize("op", ["core", "mlstm_sig", "mlstm_exp", "normalized"])
def test_second_derivative_raises_on_the_kernels(op):
    """The kernels' gradients carry no graph: with create_graph=True the first derivatives are right, and a second
    one raises instead of coming back partial (mLSTMsig's d/dq of dL/di was 0, its d/di 123% off)."""
    torch.manual_seed(fresh_seed())
    q, k, v = (torch.randn(1, 20, 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    i, f = (torch.randn(1, 20, 2, device=DEVICE, requires_grad=True) for _ in range(2))
    ld = F.logsigmoid(torch.randn(1, 20, 2, device=DEVICE) + 2).requires_grad_()
    run = {"core": lambda: ula.linear_attention(q, k, v, ld, chunk_size=16, backend="triton")[0],
           "mlstm_sig": lambda: ula.mlstm(q, k, v, i, f, "sig", chunk_size=16, backend="triton")[0],
           "mlstm_exp": lambda: ula.mlstm(q, k, v, i, f, "exp", chunk_size=16, backend="triton")[0],
           "normalized": lambda: ula.normalized_linear_attention(q, k, v, chunk_size=16, backend="triton")[0]}[op]
    wrt = (q, k, v) + ((ld,) if op == "core" else (i, f) if op.startswith("mlstm") else ())
    first = torch.autograd.grad(run().square().sum(), wrt)
    again = torch.autograd.grad(run().square().sum(), wrt, create_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    with pytest.raises(RuntimeError, match="differentiate twice"):
        sum(g.sum() for g in again).backward()


@pytest.mark.parametrize("op", ["mlstm_exp", "abc"])
def test_strided_cu_seqlens_on_the_family_kernels(op):
    """A strided cu_seqlens (every second element of a longer tensor) read by mLSTMexp's gate kernels and ABC's
    softmax kernels as an array: it corrupted memory; now the same as a contiguous copy."""
    torch.manual_seed(fresh_seed())
    T = 37
    cu = torch.tensor([0, 99, 11, 99, 20, 99, T], device=DEVICE)[::2]
    q, k, v = (torch.randn(1, T, 2, 16, device=DEVICE) for _ in range(3))
    if op == "mlstm_exp":
        i, f = torch.randn(1, T, 2, device=DEVICE), torch.randn(1, T, 2, device=DEVICE)
        run = lambda c: ula.mlstm(q, k, v, i, f, "exp", cu_seqlens=c, chunk_size=16, backend="triton")[0]  # noqa
    else:
        w = torch.randn(1, T, 2, 8, device=DEVICE)
        run = lambda c: ula.abc(q, k, v, w, cu_seqlens=c, chunk_size=16, backend="triton")[0]  # noqa
    assert not cu.is_contiguous()
    assert torch.equal(run(cu), run(cu.contiguous()))
