"""The core op is a torch.library custom op: a model calling it traces with torch.compile(fullgraph=True)
(no graph break) and gives the eager numbers, forward and gradients."""
import pytest
import torch
import torch.nn.functional as F

import ula
from ula.core import backends
from helpers import KINDS, fresh_seed, make_inputs, rel


@pytest.mark.parametrize("kind", KINDS)
def test_fullgraph_compile_matches_eager(kind):
    q, k, v, ld, rd, s0 = make_inputs(kind, kind == "vector", 1, 40, 2, 16, 8)
    cu = torch.tensor([0, 13, 40]) if kind == "scalar" else None
    if cu is not None:
        s0 = torch.randn(2, 2, 16, 8)

    def model(q, k, v, ld, rd, s0):
        o, S = ula.linear_attention(q * 2, k, v, ld, rd, initial_state=s0, output_final_state=True, chunk_size=16,
                                    cu_seqlens=cu)
        return (o.sin().sum() + S.square().sum())

    leaves = [x for x in (q, k, v, ld, rd, s0) if x is not None]
    results = []
    for fn in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        args = [None if x is None else x.detach().clone().requires_grad_() for x in (q, k, v, ld, rd, s0)]
        loss = fn(*args)
        loss.backward()
        results.append([loss] + [a.grad for a in args if a is not None])
    assert len(results[1]) == len(leaves) + 1
    for a, b in zip(*results):
        assert rel(b, a) < 1e-6


def _check_as_eager(model, compiled, leaves, *args, what=None):
    """model(*args) and compiled(*args) (a loss): the loss and the gradients of `leaves` agree to 1e-5."""
    results = []
    for fn in (model, compiled):
        for x in leaves:
            x.grad = None
        loss = fn(*args)
        loss.backward()
        results.append([loss] + [x.grad.clone() for x in leaves])
    for a, b in zip(*results):
        assert rel(b, a) < 1e-5, what


def _compiled(model):
    torch._dynamo.reset()
    return torch.compile(model, fullgraph=True, backend="aot_eager")


def test_op_is_registered():
    for name in ("linear_attention", "linear_attention_packed"):
        assert hasattr(torch.ops.ula, f"{name}_fwd") and hasattr(torch.ops.ula, f"{name}_bwd")


def _fake_checking_backend(mismatches, seen):
    """aot_autograd whose forward and backward graphs run through an fx Interpreter that records each ula custom op
    (its OpOverload, into seen) and compares its real outputs with the fake ones the trace recorded
    (node.meta["val"]): shape and dtype, into mismatches. The default CPU backend here (aot_eager) never makes that
    comparison; Inductor does, on a GPU, as a size assertion."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch.utils._pytree import tree_leaves

    def compiler(gm, _):
        class Checked(torch.fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                if n.op == "call_function" and str(n.target).startswith("ula."):
                    seen.append(n.target)
                    for j, (real, fake) in enumerate(zip(tree_leaves(out), tree_leaves(n.meta["val"]))):
                        if isinstance(real, torch.Tensor) and (tuple(real.shape) != tuple(fake.shape)
                                                               or real.dtype != fake.dtype):
                            mismatches.append(f"{n.target} output {j}: real {tuple(real.shape)} {real.dtype}, "
                                              f"fake {tuple(fake.shape)} {fake.dtype}")
                return out
        return make_boxed_func(lambda *args: Checked(gm).run(*args))
    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)


def _ula_ops_traced(model, args):
    """The ula custom ops in the forward and backward graphs of a compiled call of model(*args), in the order they ran;
    each one's real outputs are those its fake function promised."""
    seen, mismatches = [], []
    torch._dynamo.reset()
    args = [x.detach().requires_grad_() for x in args]
    torch.compile(model, fullgraph=True, backend=_fake_checking_backend(mismatches, seen))(*args).backward()
    assert not mismatches, mismatches
    return seen


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_packed_calls_stay_out_of_cuda_graphs(packed):
    """A packed call sizes its grid from cu_seqlens' values, read on the host: a CUDA graph would replay one call's
    boundaries for every other. Compiled, its forward and backward are ops tagged cudagraph_unsafe, which Inductor's
    CUDA graphs (mode="reduce-overhead") leave out; a dense call's ops are not tagged, so its graphs keep them."""
    q, k, v, ld, _, _ = make_inputs("scalar", False, 1, 40, 2, 16, 8)
    cu = torch.tensor([0, 13, 40]) if packed else None

    def model(q, k, v, ld):
        return ula.linear_attention(q, k, v, ld, cu_seqlens=cu, chunk_size=16)[0].square().sum()
    seen = _ula_ops_traced(model, (q, k, v, ld))
    name = "linear_attention_packed" if packed else "linear_attention"
    assert [str(t) for t in seen] == [f"ula.{name}_fwd.default", f"ula.{name}_bwd.default"]
    assert all((torch.Tag.cudagraph_unsafe in t.tags) == packed for t in seen)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_packed_mlstm_exp_cuda_graph_tags(packed):
    """Packed mLSTMexp's column of ones is tagged cudagraph_unsafe (its grid comes from cu_seqlens' values); its gate
    scan is not, in either form (its kernels read cu_seqlens on the device: ula/ops/_mlstm_gate_op.py)."""
    q, k, v = (torch.randn(1, 40, 2, 16) for _ in range(3))
    i, f = (torch.randn(1, 40, 2) for _ in range(2))
    cu = torch.tensor([0, 13, 40]) if packed else None

    def model(q, k, v, i, f):
        return ula.mlstm(q, k, v, i, f + 3, backend="triton", cu_seqlens=cu)[0].square().sum()
    traced = _ula_ops_traced(model, (q, k, v, i, f))
    seen = [str(t) for t in traced if torch.Tag.cudagraph_unsafe in t.tags]
    assert seen == (["ula.ones_packed_fwd.default", "ula.ones_packed_bwd.default"] if packed else [])
    assert {"ula.mlstm_exp_gates_fwd.default", "ula.mlstm_exp_gates_bwd.default"} <= {str(t) for t in traced}


@pytest.mark.parametrize("trees", [False, True], ids=["no_graphs", "graph_trees"])
def test_packed_ops_read_cu_seqlens_afresh_under_graph_trees(trees, monkeypatch):
    """Between torch.compile's CUDA graphs, a packed op may get the graphs' copy of cu_seqlens: the same tensor at
    every call, its memory rewritten without a version bump (on an H100, packed ABC 8.5e-1 from eager after its
    boundaries changed, session 35). Modelled here by writing new boundaries through .data, which bumps no version
    either: while graph trees are in use the compiled op follows them; without them it keeps the cached ones, which
    is the case the fix covers."""
    from ula.core import custom_ops
    monkeypatch.setattr(custom_ops, "graph_trees_in_use", lambda: trees)
    q, k, v = (torch.randn(1, 41, 2, 16, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 9, 41])
    call = torch.compile(lambda cu: ula.linear_attention(q, k, v, cu_seqlens=cu, backend="torch")[0],
                         backend="aot_eager", fullgraph=True)
    call(cu)
    cu.data.copy_(torch.tensor([0, 30, 41]))
    assert cu._version == 0
    want = ula.linear_attention(q, k, v, cu_seqlens=torch.tensor([0, 30, 41]), backend="reference")[0]
    err = (call(cu) - want).abs().max().item()
    assert (err < 1e-10) == trees, err


def test_trace_of_the_triton_path_only_reads_the_triton_check(monkeypatch):
    """Which path runs is decided by a check of the installed Triton (ula/core/backends.py), found at import: torch
    2.11's Dynamo cannot trace it (`re`), so a trace of the Triton path must read its answer, not run it."""
    real = backends._version

    def untraceable(text):
        if torch.compiler.is_compiling():
            raise RuntimeError("the Triton check was traced")
        return real(text)
    monkeypatch.setattr(backends, "_version", untraceable)
    q, k, v, ld, _, _ = make_inputs("scalar", False, 1, 40, 2, 16, 8)

    def model(q, k, v, ld):
        return ula.linear_attention(q, k, v, ld, backend="triton")[0]  # no chunk_size: the trace picks one
    assert rel(_compiled(model)(q, k, v, ld), model(q, k, v, ld)) < 1e-6


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_packed_mlstm_exp_traces_fullgraph(backend):
    """Packed mLSTMexp traces with fullgraph=True, cu_seqlens a graph input whose boundaries change between calls
    (its PyTorch gate scan restarts at each sequence without reading them: ula/ops/mlstm.py `_exp_scan`); outputs,
    final states and gradients as eager."""
    q, k, v = (torch.randn(1, 40, 2, 16, requires_grad=True) for _ in range(3))
    i, f = (torch.randn(1, 40, 2, requires_grad=True) for _ in range(2))

    def model(q, k, v, i, f, cu):
        h, (C, n, m) = ula.mlstm(q, k, v, i, f + 3, backend=backend, cu_seqlens=cu, output_final_state=True)
        return h.square().mean() + C.sum() + n.sum() + m.sum()
    compiled = _compiled(model)
    for bounds in ([0, 13, 40], [0, 5, 22, 40]):  # boundaries moved, and one sequence more
        _check_as_eager(model, compiled, (q, k, v, i, f), q, k, v, i, f, torch.tensor(bounds), what=bounds)


@pytest.mark.parametrize("family,packed", [("mlstm_exp", False), ("mlstm_exp", True), ("normalized", False),
                                           ("normalized", True)])
def test_families_compile_on_their_kernels(family, packed, monkeypatch):
    """Under torch.compile mLSTMexp and normalized attention run the column of ones on the Triton kernels, and
    mLSTMexp its gate scan too, as custom ops (ula/core/custom_ops.py): not the explicit column of v, whose output
    and gradient are rounded to v's dtype (in bf16 mLSTMexp's dq, dk and gate gradients were 5-7e-2 from float64 on
    an H200, eager 3-4e-3), nor the float64 PyTorch scan (Triton failed to compile Inductor's kernel of its
    backward). Outputs, final states and gradients as eager."""
    import importlib
    from ula.core import ones
    mlstm_module = importlib.import_module("ula.ops.mlstm")  # (ula.ops.mlstm is also the function)

    def taken(*a, **kw):
        raise AssertionError("a PyTorch form was taken under torch.compile")
    monkeypatch.setattr(ones, "_generic", taken)
    monkeypatch.setattr(mlstm_module, "_exp_gates", taken)
    monkeypatch.setattr(importlib.import_module("ula.ops.normalized"), "_epilogue_torch", taken)
    cu = torch.tensor([0, 13, 40]) if packed else None
    q, k, v = (torch.randn(1, 40, 2, 16, requires_grad=True) for _ in range(3))
    i, f = (torch.randn(1, 40, 2, requires_grad=True) for _ in range(2))
    leaves = [q, k, v, i, f] if family == "mlstm_exp" else [q, k, v]

    def model(q, k, v, i, f):
        if family == "mlstm_exp":
            h, (C, n, m) = ula.mlstm(q, k, v, i, f + 3, backend="triton", output_final_state=True, cu_seqlens=cu)
            return h.square().mean() + C.sum() + n.sum() + m.sum()
        return ula.normalized_linear_attention(q, k, v, backend="triton", cu_seqlens=cu)[0].square().mean()
    _check_as_eager(model, _compiled(model), leaves, q, k, v, i, f)


@pytest.mark.parametrize("form", ["l2", "a_tensor_state", "a_tensor_state_packed"])
def test_normalized_compiles_on_its_fused_function(form, monkeypatch):
    """Under torch.compile normalized attention runs its one Triton Function as a custom op
    (ula/ops/_normalized_op.py): the L2 norm, the a part and the division inside the core's kernels, as eager; with
    a learnable a per head, b a number, an initial and a final state, no L2 norm, packed or not (packed, the chunk
    carry is returned padded to a bound from shapes: T = 37, C = 16, sequences of 5, 16 and 16 steps need 3 rows
    where the bound is 5); outputs and gradients as eager, the packed ops tagged cudagraph_unsafe."""
    import importlib
    normalized = importlib.import_module("ula.ops.normalized")

    def taken(*a, **kw):
        raise AssertionError("the PyTorch path was taken under torch.compile")
    monkeypatch.setattr(normalized, "_epilogue_torch", taken)
    packed = form.endswith("packed")
    B, cu = (1, torch.tensor([0, 5, 21, 37])) if packed else (2, None)
    q, k, v = (torch.randn(B, 37, 2, 16, requires_grad=True) for _ in range(3))
    a = torch.tensor([0.5, 2.0], requires_grad=True)
    S0 = torch.randn(3 if packed else 2, 2, 17, 17, requires_grad=True)
    leaves = [q, k, v] + ([a, S0] if form != "l2" else [])

    def model(q, k, v):
        if form == "l2":
            return ula.normalized_linear_attention(q, k, v, backend="triton", chunk_size=16)[0].square().mean()
        o, S = ula.normalized_linear_attention(q, k, v, a, 0.5, qk_l2_norm=False, initial_state=S0,
                                               output_final_state=True, backend="triton", chunk_size=16,
                                               cu_seqlens=cu)
        return o.square().mean() + S.square().mean()
    _check_as_eager(model, _compiled(model), leaves, q, k, v)
    if packed:
        monkeypatch.undo()
        seen = _ula_ops_traced(lambda q, k, v: model(q, k, v), (q, k, v))
        assert [str(t) for t in seen] == ["ula.normalized_packed_fwd.default", "ula.normalized_packed_bwd.default"]
        assert all(torch.Tag.cudagraph_unsafe in t.tags for t in seen)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_packed_abc_traces_fullgraph(backend):
    """Packed ABC's cumulative softmax reads no cu_seqlens' values on the host (ula/ops/gsa.py: in PyTorch one scan
    over all tokens; on Triton its kernels, a custom op under compile, ula/ops/_abc_softmax_op.py), so it traces
    with fullgraph=True with boundaries changing between calls; outputs, the final log-normalizer and gradients as
    eager."""
    q, k, v = (torch.randn(1, 40, 2, 16, requires_grad=True) for _ in range(3))
    w = torch.randn(1, 40, 2, 8, requires_grad=True)

    def model(q, k, v, w, cu):
        o, (S1, S2, z) = ula.abc(q, k, v, w, cu_seqlens=cu, output_final_state=True, backend=backend)
        return o.square().mean() + S1.sum() + S2.sum() + z.sum()
    compiled = _compiled(model)
    for bounds in ([0, 13, 40], [0, 5, 22, 40]):  # boundaries moved, and one sequence more
        _check_as_eager(model, compiled, (q, k, v, w), q, k, v, w, torch.tensor(bounds), what=bounds)
    if backend == "triton":
        cu = torch.tensor([0, 13, 40])
        seen = {str(t) for t in _ula_ops_traced(lambda q, k, v, w: model(q, k, v, w, cu), (q, k, v, w))}
        assert {"ula.abc_softmax_fwd.default", "ula.abc_softmax_bwd.default"} <= seen, seen


@pytest.mark.parametrize("family,packed", [("gsa", False), ("abc", False), ("gsa", True)])
def test_gsa_compiles_with_float32_slot_weights(family, packed, monkeypatch):
    """Under torch.compile GSA's and ABC's second pass takes the softmax output p in float32 on the Triton kernels,
    as eager (ula/ops/gsa.py `_second_pass`, through the core's custom op): not the public call, which rounds p to
    bf16 (compiled ABC's gradients were 1.6-2x eager's error against float32 on an H100, session 36). GSA's gated
    first pass keeps o1 in float32 too. bf16 inputs, the same loss and gradients as eager."""
    import importlib
    gsa_module = importlib.import_module("ula.ops.gsa")
    public = gsa_module.linear_attention
    widths = []

    def recorded(q, *a, **kw):
        widths.append(q.shape[-1])
        return public(q, *a, **kw)
    monkeypatch.setattr(gsa_module, "linear_attention", recorded)
    q, k, v = (torch.randn(1, 37, 2, 16).bfloat16().requires_grad_() for _ in range(3))
    s = torch.randn(1, 37, 2, 8).bfloat16().requires_grad_()
    g = F.logsigmoid(torch.randn(1, 37, 2, 8) + 3).requires_grad_()
    leaves = [q, k, v, s] + ([g] if family == "gsa" else [])
    kw = dict(backend="triton", chunk_size=16, cu_seqlens=torch.tensor([0, 13, 37]) if packed else None)

    def model(q, k, v, s):
        o = ula.gsa(q, k, v, s, g, **kw)[0] if family == "gsa" else ula.abc(q, k, v, s, **kw)[0]
        return o.float().square().mean()
    _check_as_eager(model, _compiled(model), leaves, q, k, v, s)
    # the public call serves ABC's ungated first pass only (q of width 16), never p (width m = 8)
    assert widths == ([] if family == "gsa" else [16, 16]), widths


def test_packed_normalized_torch_path_traces_fullgraph():
    """On the PyTorch path (backend="torch", as for float64) normalized attention's epilogue forms each sequence's
    running sums from one cumsum over all tokens (ula/ops/normalized.py), with no read of cu_seqlens' values, so a
    packed call traces with fullgraph=True with boundaries changing between calls; as eager, with an initial and a
    final state."""
    q, k, v = (torch.randn(1, 40, 2, 16, requires_grad=True) for _ in range(3))

    def model(q, k, v, cu, S0):
        o, S = ula.normalized_linear_attention(q, k, v, 0.5, 2.0, initial_state=S0, output_final_state=True,
                                               cu_seqlens=cu, backend="torch")
        return o.square().mean() + S.square().mean()
    compiled = _compiled(model)
    for bounds in ([0, 13, 40], [0, 30, 40], [0, 5, 22, 40]):
        S0 = torch.randn(len(bounds) - 1, 2, 17, 17)
        _check_as_eager(model, compiled, (q, k, v), q, k, v, torch.tensor(bounds), S0, what=bounds)


def _packed_ops(grad=False):
    """Every op of README's table as fn(kw) -> (o, final state) on fixed inputs ([1, 40, 2, 16]; leaves that require
    grad with grad)."""
    T, H, K = 40, 2, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, H, K, generator=g).requires_grad_(grad) for _ in range(3))
    gv = F.logsigmoid(torch.randn(1, T, H, K, generator=g).requires_grad_(grad) + 3)
    gs = F.logsigmoid(torch.randn(1, T, H, generator=g).requires_grad_(grad) + 3)
    i, f = torch.randn(2, 1, T, H, generator=g).requires_grad_(grad)
    s = torch.randn(1, T, H, 8, generator=g).requires_grad_(grad)
    A = -torch.rand(H, generator=g).requires_grad_(grad)
    return {
        "core_none": lambda kw: ula.linear_attention(q, k, v, **kw),
        "core_scalar": lambda kw: ula.linear_attention(q, k, v, gs, **kw),
        "core_vector": lambda kw: ula.linear_attention(q, k, v, gv, **kw),
        "gla": lambda kw: ula.gla(q, k, v, gv, **kw),
        "mlstm_exp": lambda kw: ula.mlstm(q, k, v, i, f, **kw),
        "mlstm_sig": lambda kw: ula.mlstm(q, k, v, i, f, variant="sig", **kw),
        "normalized": lambda kw: ula.normalized_linear_attention(q, k, v, **kw),
        "gsa": lambda kw: ula.gsa(q, k, v, s, F.logsigmoid(s + 3), **kw),
        "abc": lambda kw: ula.abc(q, k, v, s, **kw),
        "linear_attn": lambda kw: ula.linear_attn(q, k, v, **kw),
        "retention": lambda kw: ula.retention(q, k, v, **kw),
        "mamba2": lambda kw: ula.mamba2(q, k, v, F.softplus(i), A, **kw),
        "hgrn2": lambda kw: ula.hgrn2(q, v, gv, **kw),
    }


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(_packed_ops()))
def test_every_op_packed_traces_fullgraph(name, backend):
    """Every op (README's table), packed, traces with fullgraph=True on both paths (no read of cu_seqlens' values
    in a trace), and the compiled call gives the eager output."""
    fn = _packed_ops()[name]
    kw = dict(cu_seqlens=torch.tensor([0, 13, 40]), backend=backend)
    got = _compiled(lambda: fn(kw)[0])()
    assert rel(got, fn(kw)[0]) < 1e-6


@pytest.mark.parametrize("manager,want", [("absent", False), (None, False), ("a manager", True), ("raises", True)])
def test_graph_trees_in_use(manager, want, monkeypatch):
    """Whether the packed ops read cu_seqlens afresh: only where torch.compile's CUDA graph trees manage the device,
    and also where that cannot be told (an unknown torch), as reading again is only slower. Once seen, kept (for
    the backward's ops in autograd's thread): a later call says True without asking."""
    import sys
    import types
    from ula.core import custom_ops
    monkeypatch.setattr(custom_ops, "_TREES_SEEN", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    trees = types.ModuleType("torch._inductor.cudagraph_trees")

    def get_manager(device_index, create_if_none_exists=True):
        assert device_index == 0 and not create_if_none_exists
        if manager == "raises":
            raise AttributeError("changed API")
        return manager
    trees.get_manager = get_manager
    if manager == "absent":
        monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    else:
        monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", trees)
    assert custom_ops.graph_trees_in_use() == want
    trees.get_manager = None  # asked no more once seen
    monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    assert custom_ops.graph_trees_in_use() == want


def test_abc_softmax_compiles_under_another_tiling(tmp_path, monkeypatch):
    """ABC's cumulative-softmax op returns nothing whose shape depends on its tiles (ula/ops/_abc_softmax_op.py: its
    backward reads φ, no per-block buffer). When its fake function sized such a buffer by the block length,
    Inductor's FX graph cache, which keys a graph on the graph and not on what a fake function returns
    (pytorch/pytorch#160472), served a graph cached under one ULA_TUNE_ABC_SOFTMAX to another: a size assertion in
    the compiled call (an H100, session 37). Two compiles of the same model, on one cache, tiles changed in between:
    both give the float64 PyTorch form's loss and gradient (fresh inputs)."""
    import torch._inductor.config as inductor_config
    from ula.core.triton.utils import set_tuning
    from ula.ops.gsa import _cumulative_softmax
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # a cache of this test's own
    # (inductor's own patch, not monkeypatch's: pytest's undo deletes a config entry not in the module's __dict__,
    # which hid fx_graph_cache from later compiles in the same worker)
    seed = fresh_seed()
    w = torch.randn(2, 40, 2, 8).requires_grad_()  # (with a gradient: the backward's inputs are saved)

    def model(w, backend="triton"):
        return _cumulative_softmax(w, None, None, backend)[0].square().sum()
    wd = w.detach().double().requires_grad_()
    want = model(wd, "torch")
    want.backward()
    try:
        with inductor_config.patch(compile_threads=1, fx_graph_cache=True):
            for cfg in (None, "16,4,1,4"):  # the interpreter's default blocks of 8 steps, then 16
                set_tuning("abc_softmax", cfg)
                w.grad = None
                got = torch.compile(model, fullgraph=True)(w)
                got.backward()
                assert rel(got, want) < 1e-5 and rel(w.grad, wd.grad) < 1e-5, (cfg, seed)
                torch._dynamo.reset()
    finally:
        set_tuning("abc_softmax", None)
        torch._dynamo.reset()


# every pair of (rows or packed, with or without states, backend) at least once per op, in 4 of the 8 combinations (the
# suite's time on a 2-core machine): states with rows on Triton and packed on PyTorch
@pytest.mark.parametrize("packed,states,backend", [(False, False, "triton"), (True, True, "triton"),
                                                   (False, True, "torch"), (True, False, "torch")],
                         ids=["rows-triton", "packed-states-triton", "rows-states-torch", "packed-torch"])
@pytest.mark.parametrize("name", sorted(set(_packed_ops()) - {"linear_attn", "mamba2", "hgrn2"}))
def test_custom_ops_fake_outputs_match_real(name, packed, states, backend):
    """Each ula custom op that an op's compiled forward and backward run returns what its fake function promised
    (shape, dtype), on both paths (Triton: the interpreter, 40 steps cross its blocks of 8), rows and packed, and with
    an initial state (an eager call's final state, its gradient taken) and the final state in the loss. (Not
    linear_attn, mamba2 and hgrn2: ula/ops/conveniences.py calls the core's ops on them as core_none, core_scalar and
    core_vector do, with other q, k and decay values.)"""
    from torch.utils._pytree import tree_leaves, tree_map
    fn = _packed_ops(grad=True)[name]
    kw = dict(cu_seqlens=torch.tensor([0, 13, 40]) if packed else None, backend=backend)
    if states:
        with torch.no_grad():
            S0 = fn(dict(kw, output_final_state=True))[1]
        kw.update(initial_state=tree_map(lambda x: x.detach().requires_grad_(), S0), output_final_state=True)

    def loss():
        o, S = fn(kw)
        return o.float().square().sum() + sum(x.float().sum() for x in tree_leaves(S) if torch.is_tensor(x))
    names = [str(t) for t in _ula_ops_traced(loss, ())]  # (fails on a real output unlike its fake)
    torch._dynamo.reset()
    assert any(t.endswith("_fwd.default") for t in names) and any(t.endswith("_bwd.default") for t in names), names
