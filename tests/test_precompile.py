"""The first call's parallel compile (ula/core/triton/precompile.py): its dry run must ask for every kernel
configuration that the real forward+backward launches, or those are compiled one by one as before. Under the
interpreter nothing compiles, so the requests and the real launches are recorded and compared."""
import pytest
import torch
import torch.nn.functional as F

import ula
from helpers import record_launches
from ula.core.op import dry_call
from ula.core.triton import precompile, utils

B, T, H, K, V = 2, 45, 2, 32, 16


def _config(kernel, num_warps, constexprs):
    return kernel.fn.__name__ if hasattr(kernel, "fn") else repr(kernel), num_warps, tuple(sorted(constexprs.items()))


def _inputs(case, g):
    r = lambda *s, sc=1.0: (torch.randn(*s, generator=g) * sc).requires_grad_()  # noqa: E731
    q, k, v = r(B, T, H, K, sc=K ** -0.5), r(B, T, H, K, sc=K ** -0.5), r(B, T, H, V)
    lsig = lambda *s: F.logsigmoid(torch.randn(*s, generator=g) + 2).requires_grad_()  # noqa: E731
    ld = rd = kg = None
    if case == "vector":
        ld = lsig(B, T, H, K)
    elif case == "scalar_key_gate":
        ld, kg = lsig(B, T, H), torch.randn(B, T, H, generator=g).requires_grad_()
    elif case == "right":  # GSA's first pass
        rd = lsig(B, T, H, V)
    return q, k, v, ld, rd, kg


@pytest.mark.parametrize("case", ["none", "vector", "scalar_key_gate", "right"])
def test_dry_run_asks_for_every_launch_of_the_real_call(case, monkeypatch):
    g = torch.Generator().manual_seed(3)
    q, k, v, ld, rd, kg = _inputs(case, g)
    asked = set()
    monkeypatch.setattr(utils, "_warmup", lambda kernel, grid, args, w, cx, s=None: asked.add(_config(kernel, w, cx)))
    precompile.dry(lambda: dry_call(q, k, v, ld, rd, None, None, K ** -0.5, False, 16, "triton", kg, True))
    assert asked, "the dry run asked for no compile"
    launches = record_launches(monkeypatch, lambda kernel, w, cx, s: _config(kernel, w, cx))
    from ula.core.op import run
    o, S, _ = run(q, k, v, ld, rd, None, None, K ** -0.5, False, 16, "triton", kg)
    o.float().pow(2).sum().backward()
    launched = set(launches)
    assert launched, "the real call launched nothing through utils.launch"
    assert launched <= asked, f"launched but not asked for: {launched - asked}"
    assert not getattr(utils._DRY, "on", False)


@pytest.mark.parametrize("case", ["normalizer", "scalar_key_gate"])
def test_dry_run_of_the_column_of_ones(case, monkeypatch):
    """The same for linear attention with its column of ones (ula/core/ones.py: mLSTMexp, normalized attention)."""
    from ula.core import ones
    g = torch.Generator().manual_seed(5)
    q, k, v, ld, _, kg = _inputs("scalar_key_gate" if case == "scalar_key_gate" else "none", g)
    asked = set()
    monkeypatch.setattr(utils, "_warmup", lambda kernel, grid, args, w, cx, s=None: asked.add(_config(kernel, w, cx)))
    precompile.dry(lambda: ones._dry_ones(q, k, v, ld, kg, None, None, K ** -0.5, None, 16, True, ""))
    launches = record_launches(monkeypatch, lambda kernel, w, cx, s: _config(kernel, w, cx))
    o, den, _ = ones.linear_attention_with_ones(q, k, v, ld, scale=K ** -0.5, chunk_size=16, backend="triton",
                                                key_gate=kg)
    (o.float().pow(2).sum() + den.float().pow(2).sum()).backward()
    launched = set(launches)
    assert launched, "the real call launched nothing through utils.launch"
    assert launched <= asked, f"launched but not asked for: {launched - asked}"


@pytest.mark.parametrize("h0, l2", [(False, False), (True, True)])
def test_dry_run_of_normalized_attention(h0, l2, monkeypatch):
    """The same for normalized attention's one Function (ula/ops/_normalized_fused.py): the core's kernels with the
    column of ones and the dV pass's rank-one term, the division's kernels and the L2 norm's (no final state: the dry
    run passes no state gradients, as for every op)."""
    from ula.ops import _normalized_fused as nf
    g = torch.Generator().manual_seed(9)
    q, k, v = _inputs("none", g)[:3]
    a = (torch.rand(H, generator=g) + 1).requires_grad_()
    S0 = torch.randn(B, H, K + 1, V + 1, generator=g) if h0 else None
    asked = set()
    monkeypatch.setattr(utils, "_warmup", lambda kernel, grid, args, w, cx, s=None: asked.add(_config(kernel, w, cx)))
    parts = (None,) * 4 if S0 is None else (S0[:, :, :K, :V].contiguous(), S0[:, :, :K, V].contiguous(),
                                            S0[:, :, K, :V].contiguous(), S0[:, :, K, V].contiguous())
    precompile.dry(lambda: nf._dry(q, k, v, a.detach(), *parts, 0.0, 0.5, l2, 1e-6, None, 16, "", True, True))
    launches = record_launches(monkeypatch, lambda kernel, w, cx, s: _config(kernel, w, cx))
    o, _ = ula.normalized_linear_attention(q, k, v, a, 0.5, initial_state=S0, qk_l2_norm=l2, chunk_size=16,
                                           backend="triton")
    o.float().pow(2).sum().backward()
    launched = set(launches)
    assert any(c[0] == "_output_kernel" and ("R1", 2) in c[2] for c in launched), "no dV pass with the rank-one term"
    assert launched <= asked, f"launched but not asked for: {launched - asked}"


@pytest.mark.parametrize("m0", [False, True])
def test_dry_run_of_the_mlstm_gates(m0, monkeypatch):
    """The same for mLSTMexp's gate-scan kernels (ula/ops/_mlstm_gate_kernels.py), with the gradients the mLSTMexp op
    sends them (ld', logw and m)."""
    from ula.ops import _mlstm_gate_kernels as gates
    g = torch.Generator().manual_seed(7)
    i, f = (torch.randn(B, T, H, generator=g).requires_grad_() for _ in range(2))
    m0t = torch.randn(B, H, generator=g).requires_grad_() if m0 else None
    asked = set()
    monkeypatch.setattr(utils, "_warmup", lambda kernel, grid, args, w, cx, s=None: asked.add(_config(kernel, w, cx)))
    precompile.dry(lambda: gates._dry(i, f, m0t, None, torch.float32, True))
    launches = record_launches(monkeypatch, lambda kernel, w, cx, s: _config(kernel, w, cx))
    ldp, logw, m, _ = gates.mlstm_exp_gates(i, f, m0t, out_dtype=torch.float32)
    (ldp.sum() + logw.pow(2).sum() + m.sum()).backward()
    launched = set(launches)
    assert len(launched) == 4, launched  # two summary kernels and two block kernels
    assert launched <= asked, f"launched but not asked for: {launched - asked}"


def test_dry_run_swallows_errors_and_leaves_launches_live(monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("inside the dry run")
    monkeypatch.setattr(utils, "_warmup", boom)
    q = torch.randn(1, 8, 1, 16)
    precompile.dry(lambda: dry_call(q, q, q, None, None, None, None, 1.0, False, 16, "triton", None, True))
    assert not getattr(utils._DRY, "on", False)
    o, _ = ula.linear_attention(q, q, q, backend="triton")  # a real run after it still computes
    assert torch.isfinite(o).all()


def test_dry_launches_are_per_thread(monkeypatch):
    """While one thread runs dry, another thread's launches still run (a flag shared by all threads would turn
    them into compile requests and leave their outputs unwritten)."""
    import threading
    asked = []
    monkeypatch.setattr(utils, "_warmup", lambda *a: asked.append(a))
    q = torch.randn(1, 8, 1, 16)
    results = {}

    def other():
        results["o"] = ula.linear_attention(q, q, q, backend="triton")[0]

    with utils.dry_launches():
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert not asked, "the other thread's launches became compile requests"
    assert torch.isfinite(results["o"]).all()


@pytest.mark.parametrize("packed", [False, True])
def test_dry_run_of_the_abc_softmax(packed, monkeypatch):
    """The same for ABC's cumulative-softmax kernels (ula/ops/_abc_softmax_kernels.py): the six of a forward+backward
    with an initial log-normalizer, without a final state."""
    from ula.ops import _abc_softmax_op as op
    g = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 13, 2 * T]) if packed else None
    w = torch.randn(1 if packed else B, 2 * T if packed else T, H, 6, generator=g).requires_grad_()
    z0 = torch.randn(2 if packed else B, H, 6, generator=g).requires_grad_()
    asked = set()
    monkeypatch.setattr(utils, "_warmup", lambda kernel, grid, args, w, cx, s=None: asked.add(_config(kernel, w, cx)))
    precompile.dry(lambda: op._dry(w, z0, cu, True))
    launches = record_launches(monkeypatch, lambda kernel, w, cx, s: _config(kernel, w, cx))
    phi, _ = op.cumulative_softmax(w, z0, cu)
    (phi * torch.randn(phi.shape, generator=g)).sum().backward()
    launched = set(launches)
    assert len(launched) == 6, launched
    assert launched <= asked, f"launched but not asked for: {launched - asked}"
