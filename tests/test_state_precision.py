"""The matmul precision parts (ula/core/precision.py). First wide_states (ula/core/triton/utils.py state_dot): with
half-precision inputs the state kernel's matmuls and the output kernel's q @ S take DOT_TF32 (float32 under the
interpreter) and the border states are float32. Forward and every gradient against the float64 reference recurrence,
in float32 (the switch leaves it alone) and float16 (the path taken: every launch's codes are recorded), odd length,
initial and final state, through the forward, fused_backward (left decays), fused_backward_right (a right decay
alone), the generic backward (both decays) and the normalizer's forward (ula/core/ones.py). Then the other parts,
each op's default parts, and set_precision."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import ula  # noqa: E402
from helpers import DEVICE, compare_with_reference, emulated_bf16_errors, fresh_seed, make_inputs, rel  # noqa: E402
from ula.core.triton import output, state, utils  # noqa: E402

TOL = {torch.float32: 1e-4, torch.float16: 1e-2}  # tests/test_triton.py's TOL32, TOL16


@pytest.fixture
def tf32_states(monkeypatch):
    """wide_states for every call (set_precision's override); returns the (DOT, SDOT) codes of every state / output
    kernel launch (SDOT None: a state kernel, whose DOT is the states path's)."""
    from ula.core import precision
    monkeypatch.setattr(precision, "_OVERRIDE", [("wide_states",)])
    seen = []

    def spy(real, is_output):
        def launch(kernel, grid, *args, **cx):
            seen.append((cx["DOT"], cx["SDOT"] if is_output else None))
            return real(kernel, grid, *args, **cx)
        return launch

    monkeypatch.setattr(output, "launch", spy(output.launch, True))
    monkeypatch.setattr(state, "launch", spy(state.launch, False))
    return seen


def _check_codes(seen, dtype):
    assert seen, "no state or output kernel ran"
    if dtype == torch.float16:
        assert {d for d, s in seen if s is None} == {utils.DOT_TF32}, seen   # every state kernel
        assert {s for d, s in seen if s is not None} == {utils.DOT_TF32}, seen  # every output kernel's q @ S
        assert utils.DOT_F16 in {d for d, s in seen if s is not None}, seen  # intra-chunk matmuls stay half
    else:
        assert utils.DOT_TF32 not in {c for pair in seen for c in pair}, seen


def _on(inputs, dtype):
    return tuple(None if x is None else x.to(DEVICE).to(dtype) if i < 3 else x.to(DEVICE)
                 for i, x in enumerate(inputs))


def _check(errs, seed, dtype):
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= TOL[dtype]}
    assert not bad, f"relative errors over {TOL[dtype]}: {bad} (seed {seed})"


def _gla(q, k, v, ld, rd, **kw):
    assert rd is None
    return ula.gla(q, k, v, ld, chunk_size=32, backend="triton", **kw)


def _la(q, k, v, ld, rd, **kw):
    return ula.linear_attention(q, k, v, ld, rd, chunk_size=32, backend="triton", **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("case", ["gla", "scalar-rev", "right", "vector+right"])
def test_against_reference(tf32_states, case, dtype):
    """gla: fused_backward, decays per feature; scalar-rev: one decay per step, reverse; right: a right decay
    alone (fused_backward_right); vector+right: both decays (the generic backward_pass)."""
    seed = fresh_seed()
    kind, right = {"gla": ("vector", False), "scalar-rev": ("scalar", False), "right": ("none", True),
                   "vector+right": ("vector", True)}[case]
    inputs = _on(make_inputs(kind, right, 1, 67, 2, 16, 24), dtype)
    fn = _gla if case == "gla" else _la
    kw = dict(reverse=True) if case == "scalar-rev" else {}
    _check(compare_with_reference(fn, inputs, **kw), seed, dtype)
    _check_codes(tf32_states, dtype)


def test_border_states_float32(tf32_states):
    """Border states asked for in bfloat16 come back float32 on the tf32 path (float16 inputs take it here)."""
    from ula.core import precision
    from ula.core.triton import chunk_recurrence_triton
    q, k, v = (torch.randn(1, 40, 1, 16, device=DEVICE, dtype=torch.float16) for _ in range(3))
    with precision.active("wide_states"):
        _, _, border = chunk_recurrence_triton(q, k, v, chunk_size=16, state_dtype=torch.bfloat16)
    assert border.dtype == torch.float32
    _, _, border = chunk_recurrence_triton(q, k, v, chunk_size=16, state_dtype=torch.bfloat16)
    assert border.dtype == torch.bfloat16


def test_ones_float16(tf32_states):
    """The normalizer's forward (ula/core/ones.py) and its fused backward on the tf32 path, against the float64
    reference recurrence on [v, 1]."""
    from ula.core.ones import linear_attention_with_ones
    seed = fresh_seed()
    B, T, H, K, V = 1, 67, 2, 16, 16
    q, k, v = (torch.randn(B, T, H, K), torch.randn(B, T, H, K) * K ** -0.5, torch.randn(B, T, H, V))
    q, k, v = (x.half().to(DEVICE) for x in (q, k, v))
    ld = F.logsigmoid(torch.randn(B, T, H) + 2).to(DEVICE)
    S0, n0 = (torch.randn(B, H, K, V) * 0.3).to(DEVICE), (torch.randn(B, H, K) * 0.3).to(DEVICE)
    leaves = [q, k, v, S0, n0, ld]
    for x in leaves:
        x.requires_grad_()
    o, den, (S, n) = linear_attention_with_ones(q, k, v, ld, initial_state=(S0, n0), output_final_state=True,
                                                chunk_size=32, backend="triton")
    ws = [torch.randn(t.shape, dtype=torch.float64, device=t.device) for t in (o, den, S, n)]
    loss = sum((a.double() * w).sum() for a, w in zip((o, den, S, n), ws))
    got = [o, den, S, n] + list(torch.autograd.grad(loss, leaves))
    d = [x.detach().double().requires_grad_() for x in leaves]
    q2, k2, v2, S02, n02, ld2 = d
    o2, S2 = ula.linear_attention(q2, k2, torch.cat([v2, torch.ones_like(v2[..., :1])], -1), ld2,
                                  initial_state=torch.cat([S02, n02.unsqueeze(-1)], -1), output_final_state=True,
                                  backend="reference")
    want = [o2[..., :V], o2[..., V], S2[..., :V], S2[..., V]]
    loss2 = sum((a * w).sum() for a, w in zip(want, ws))
    want += list(torch.autograd.grad(loss2, d))
    names = ["o", "den", "S", "n", "dq", "dk", "dv", "dS0", "dn0", "dld"]
    errs = {name: rel(a, b) for name, a, b in zip(names, got, want)}
    _check(errs, seed, torch.float16)
    _check_codes(tf32_states, torch.float16)


def test_round_tf32():
    """round_tf32 (DOT_TF32's operands under ULA_EMULATE_BF16=1) against rounding in float64: to a multiple of
    2^(e - 10) for |x| in [2^e, 2^(e + 1)), ties to even (ties included)."""
    import numpy as np
    import triton
    import triton.language as tl

    @triton.jit
    def _round(x, y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(y + i, utils.round_tf32(tl.load(x + i, mask=i < n, other=0.0)), mask=i < n)

    x = (torch.randn(4096, dtype=torch.float64) * 2.0 ** torch.randint(-20, 20, (4096,))).float()
    x[:8] = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 1 + 2 ** -11 + 2 ** -20, 0.0,
                          2 - 2 ** -12, 1.0, -3.0])  # ties to even (down, up), above a tie, carry into the exponent
    y = torch.empty(x.shape, device=DEVICE)
    _round[(1,)](x.to(DEVICE), y, x.numel(), BLOCK=4096)
    xd = x.double().numpy()
    e = np.floor(np.log2(np.where(xd == 0, 1.0, np.abs(xd))))
    ulp = 2.0 ** (e - 10)
    want = np.round(xd / ulp) * ulp  # numpy rounds halves to even
    assert np.array_equal(y.cpu().double().numpy(), want)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_own_block_tf32(monkeypatch, reverse):
    """Part own_block (utils.own_dot): with bfloat16 operands (the interpreter's emulated ones here) the rows' own
    block of decays per feature takes tf32 in the output kernel's single-matmul path; every other matmul keeps the
    bfloat16 code. Against float64 within bfloat16 tolerance, forward and all gradients."""
    monkeypatch.setattr(utils, "EMULATE_BF16", True)
    from ula.core import precision
    monkeypatch.setattr(precision, "_OVERRIDE", [("own_block",)])
    seen = []
    real = output.launch

    def spy(kernel, grid, *args, **cx):
        seen.append((cx["DOT"], cx["ODOT"]))
        return real(kernel, grid, *args, **cx)

    monkeypatch.setattr(output, "launch", spy)
    seed = fresh_seed()
    inputs = _on(make_inputs("vector", False, 1, 67, 2, 16, 24), torch.float32)
    _check(compare_with_reference(_la, inputs, reverse=reverse), seed, torch.float16)
    assert seen and {d for d, o in seen} == {utils.DOT_BF16_EMULATED}, seen
    assert {o for d, o in seen} == {utils.DOT_TF32}, seen


def test_set_precision_switches_and_restores(monkeypatch):
    """ula.set_precision: a preset, parts (list or comma-separated) or None (each op's default); returns the previous
    choice; a bad value names the argument, the presets and the parts. The ops check their own argument early."""
    from ula.core import precision
    monkeypatch.setattr(precision, "_OVERRIDE", [None])
    assert precision.resolve(("own_block",)) == ("own_block",)
    assert ula.set_precision("accurate") is None
    assert set(precision.resolve(())) == set(precision.PARTS) - {"wide_states"}
    before = ula.set_precision("split_keys,own_block")
    assert precision.resolve(("states_forward",)) == ("own_block", "split_keys")
    assert ula.set_precision(before) == ("own_block", "split_keys")
    assert ula.set_precision(None) == tuple(sorted(precision.PRESETS["accurate"]))
    assert precision.resolve(("states_forward",)) == ("states_forward",)
    with pytest.raises(ValueError, match="set_precision: precision must be one of .*'accurate'.*own_block"):
        ula.set_precision("tf32")
    with pytest.raises(ValueError, match="set_precision: precision must be one of"):
        ula.set_precision(["own_block", "bf16"])
    q = torch.randn(1, 8, 1, 16)
    g = F.logsigmoid(torch.randn(1, 8, 1, 16))
    with pytest.raises(ValueError, match="gla: precision must be one of"):
        ula.gla(q, q, q, g, precision="fp8")
    with pytest.raises(ValueError, match="gsa: precision must be one of"):
        ula.gsa(q, q, q, g, g, precision=7)
    with pytest.raises(ValueError, match="linear_attention: precision must be one of"):
        ula.linear_attention(q, q, q, precision="exact")


def _record_parts(monkeypatch):
    """The parts every core call and normalizer call runs with (precision.active's codes), in call order."""
    from ula.core import precision
    seen = []
    real = precision.active

    def spy(code):
        seen.append(code)
        return real(code)

    monkeypatch.setattr(precision, "active", spy)
    return seen


def test_each_ops_default_parts(monkeypatch):
    """The measured defaults (benchmarks/RESULTS.md, sessions 13-14): GLA "accurate", GSA own_block in pass 1 and
    own_block with the backward's states parts in pass 2, a
    constant decay states_forward, other core calls and the normalizer's path none; set_precision's choice
    replaces them all, and None restores them."""
    from ula.core import precision
    monkeypatch.setattr(precision, "_OVERRIDE", [None])
    seen = _record_parts(monkeypatch)
    B, T, H, K = 1, 19, 2, 16
    q, k, v = (torch.randn(B, T, H, K, device=DEVICE, requires_grad=True) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, K, device=DEVICE))
    s = torch.randn(B, T, H, 16, device=DEVICE)
    accurate = precision.encode(precision.parse("accurate"))

    def calls():
        seen.clear()
        out = {}
        for name, fn in (("gla", lambda: ula.gla(q, k, v, g, backend="triton")[0]),
                         ("gsa", lambda: ula.gsa(q, k, v, s, g, backend="triton")[0]),
                         ("retention", lambda: ula.retention(q, k, v, backend="triton")[0]),
                         ("linear_attn", lambda: ula.linear_attn(q, k, v, backend="triton")[0]),
                         ("mlstm_exp", lambda: ula.mlstm(q, k, v, g[..., 0], g[..., 1], backend="triton")[0])):
            n = len(seen)
            fn().sum().backward()
            out[name] = set(seen[n:])
        return out

    got = calls()
    assert got["gla"] == {accurate}, got
    import importlib
    pass_precision = importlib.import_module("ula.ops.gsa").PASS_PRECISION  # (ula.ops.gsa is also the function)
    gsa_passes = {precision.encode(precision.parse(x)) for x in pass_precision}
    pass2 = precision.encode(precision.parse(("own_block", "states_backward", "q_states_backward")))
    assert gsa_passes == {"own_block", pass2}
    assert got["gsa"] == gsa_passes, got
    assert got["retention"] == {"states_forward"}, got
    assert got["linear_attn"] == {""} and got["mlstm_exp"] == {""}, got
    ula.set_precision("fast")
    assert all(v == {""} for v in calls().values()), seen
    ula.set_precision("accurate")
    assert all(v == {accurate} for v in calls().values()), seen


@pytest.mark.parametrize("case", ["gla", "gla-varlen", "constant", "scalar-accurate"])
def test_parts_against_reference(monkeypatch, case):
    """Each op's default parts and "accurate" with emulated bfloat16 matmuls (the interpreter's stand-in for the
    GPU's; tf32 operands rounded): forward, final state and every gradient against the float64 reference within
    bfloat16 tolerance, odd length, initial state; GLA also varlen."""
    from ula.core import precision
    monkeypatch.setattr(utils, "EMULATE_BF16", True)
    monkeypatch.setattr(precision, "_OVERRIDE", [precision.parse("accurate") if "accurate" in case else None])
    seen = _record_parts(monkeypatch)
    seed = fresh_seed()
    kind = {"gla": "vector", "gla-varlen": "vector", "constant": "constant", "scalar-accurate": "scalar"}[case]
    inputs = _on(make_inputs(kind, False, 1, 67, 2, 16, 24), torch.float32)
    kw = {}
    if case == "gla-varlen":
        kw["cu_seqlens"] = torch.tensor([0, 5, 38, 67], device=DEVICE)
        q, k, v, ld, rd, h0 = inputs
        inputs = (q, k, v, ld, rd, (torch.randn(3, 2, 16, 24) * 0.3).to(DEVICE))
    fn = _gla if case.startswith("gla") else _la
    errs = compare_with_reference(fn, inputs, **kw)
    # bfloat16's bounds, as the GPU quality test's: 1e-2, and 2e-2 for a log decay's gradient (a sum of terms that
    # cancel; one seed in ~1000 reached 1.03e-2 for a scalar decay)
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= (2e-2 if k == "dld" else 1e-2)}
    assert not bad, f"relative errors over the bf16 bounds: {bad} (seed {seed})"
    want = {"constant": "states_forward"}.get(case, precision.encode(precision.parse("accurate")))
    assert set(seen) == {want}, seen


def test_gla_accurate_lowers_every_error():
    """"accurate" (GLA's default) against "fast" for GLA with emulated bf16 matmuls and bf16 storage
    (benchmarks/cpu_bf16_error.py --bf16, the GPU test's gates): the error of o and every gradient against float64
    drops, dg's by ~3x (on the H100: o 3.30 -> 2.43e-3, dg 3.91 -> 1.77e-3, RESULTS.md session 13)."""
    import os
    seed = str(int.from_bytes(os.urandom(2), "little"))
    errs = [list(emulated_bf16_errors("--op", "gla", "--bf16", "--gpu-inputs", "--shape", "1,96,1,32,32", "--chunk",
                                      "32", "--seed", seed, ULA_PRECISION=choice).values())  # o dq dk dv dg
            for choice in ("fast", "accurate")]
    (o0, *g0), (o1, *g1) = errs
    assert all(b < 0.85 * a for a, b in zip([o0] + g0, [o1] + g1)), (errs, seed)
    assert g1[-1] < 0.5 * g0[-1], (errs, seed)


def test_active_parts_are_per_thread():
    """The parts a core call runs with are set per thread (a backward runs on autograd's thread, another forward
    may run on another): a thread inside `active` does not change what another thread sees."""
    import threading
    from ula.core import precision
    seen = {}
    inside, leave = threading.Event(), threading.Event()

    def worker():
        with precision.active("own_block,split_keys"):
            seen["worker"] = precision.on("split_keys")
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    inside.wait(10)
    seen["main"] = precision.on("split_keys")
    leave.set()
    t.join()
    assert seen == {"worker": True, "main": False}
    assert not precision.on("own_block")
