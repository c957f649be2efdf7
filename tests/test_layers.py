"""The token mixers of ula.layers: chunk path == recurrent steps, chunked continuation, varlen,
gradients, fixed-size states, and the paper-given shapes of the GLA, GSA and mLSTM layers."""
import pytest
import torch

from helpers import SMALL_MIXER_KWARGS as SMALL, fresh_seed, rel
from ula.layers import LINEAR_MIXERS, MIXERS, build_mixer, softcap

D, H = 32, 4


pytestmark = pytest.mark.usefixtures("one_thread")


def make(name, **kw):
    return build_mixer(name, D, H, chunk_size=16, **{**SMALL.get(name, {}), **kw})


def stepped(m, x):
    """(y, final state) of m run one token at a time over x [B, T, d], from no state."""
    st, ys = None, []
    with torch.no_grad():
        for t in range(x.shape[1]):
            yt, st = m.step(x[:, t], st)
            ys.append(yt)
    return torch.stack(ys, 1), st


def tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for y in (x or ()) for t in tensors(y)]


def test_registry():
    assert set(MIXERS) == {"gla", "gsa", "mlstm_exp", "mlstm_sig", "linear", "retnet", "mamba2", "hgrn2",
                           "normalized", "softmax"}
    with pytest.raises(ValueError, match="unknown mixer"):
        build_mixer("nope", D, H)


@pytest.mark.parametrize("name", list(MIXERS))
def test_step_equals_chunk(name):
    seed = fresh_seed()
    m = make(name)
    x = torch.randn(2, 40, D)
    with torch.no_grad():
        y, S = m(x)
    ys, st = stepped(m, x)
    assert rel(ys, y) <= 1e-4, f"{name} seed {seed}: steps vs chunk {rel(ys, y):.2e}"
    for a, b in zip(tensors(st), tensors(S)):
        assert rel(a, b) <= 1e-4, f"{name} seed {seed}: final states differ"


@pytest.mark.parametrize("name", list(MIXERS))
def test_chunk_continuation(name):
    """forward on a prefix, then forward on the rest from the returned state == one forward."""
    seed = fresh_seed()
    m = make(name)
    x = torch.randn(2, 37, D)
    with torch.no_grad():
        y, _ = m(x)
        y1, S1 = m(x[:, :21])
        y2, _ = m(x[:, 21:], S1)
    assert rel(torch.cat([y1, y2], 1), y) <= 1e-4, f"{name} seed {seed}"


@pytest.mark.parametrize("name", list(MIXERS))
def test_varlen_equals_separate(name):
    seed = fresh_seed()
    m = make(name)
    lens = [13, 30, 5]
    xs = [torch.randn(1, n, D) for n in lens]
    cu = torch.tensor([0, 13, 43, 48])
    with torch.no_grad():
        yv, Sv = m(torch.cat(xs, 1), cu_seqlens=cu)
        ys = torch.cat([m(x)[0] for x in xs], 1)
    assert rel(yv, ys) <= 1e-4, f"{name} seed {seed}"
    if name != "softmax":
        assert all(t.shape[0] == 3 for t in tensors(Sv)), "one state per packed sequence"


@pytest.mark.parametrize("name", list(MIXERS))
def test_gradients_reach_every_parameter(name):
    fresh_seed()
    m = make(name)
    x = torch.randn(2, 20, D, requires_grad=True)
    y, _ = m(x)
    (y ** 2).mean().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None, f"{name}.{pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}.{pname} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name}.{pname} has an all-zero gradient"
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


@pytest.mark.parametrize("name", LINEAR_MIXERS)
def test_state_size_fixed(name):
    m = make(name)
    x = torch.randn(1, 30, D)
    with torch.no_grad():
        _, S = m(x[:, :3])
        n0 = sum(t.numel() for t in tensors(S))
        for t in range(3, 30):
            _, S = m.step(x[:, t], S)
    assert sum(t.numel() for t in tensors(S)) == n0


def test_softmax_cache_grows():
    m = make("softmax")
    with torch.no_grad():
        _, S = m(torch.randn(1, 3, D))
        _, S = m.step(torch.randn(1, D), S)
    assert S[0].shape[2] == 4


def test_gla_layer_shapes():
    m = build_mixer("gla", 64, 4)
    assert m.q_proj.out_features == 32 and m.k_proj.out_features == 32 and m.v_proj.out_features == 64  # d/2, d
    assert m.gk_down.out_features == 16 and m.gk_up.out_features == 32 and m.tau == 16.0
    x = torch.randn(1, 3, 64)
    g = m._inputs(x)[3]
    ref = torch.nn.functional.logsigmoid(m.gk_up(m.gk_down(x))) / 16
    assert torch.allclose(g.flatten(-2), ref)
    assert (g < 0).all()


def test_gsa_layer_shapes():
    m = build_mixer("gsa", 64, 4)
    assert m.num_slots == 64 and m.n_heads == 4 and m.tau == 8.0
    assert m.f_proj.out_features == 4 * 64
    with torch.no_grad():
        _, (S1, S2) = m(torch.randn(1, 5, 64))
    assert S1.shape == (1, 4, 16, 64) and S2.shape == (1, 4, 64, 16)


def test_gla_gsa_gate_biases_start_as_documented():
    """GLA: b_r = 2, b_α = 4; GSA: b_α = 3 (None: no bias, as Eq. 8 prints); kept by CausalLM's init."""
    from ula.models import CausalLM, LMConfig
    gla_, gsa_ = build_mixer("gla", 64, 4), build_mixer("gsa", 64, 4)
    assert torch.all(gla_.r_proj.bias == 2.0) and torch.all(gla_.gk_up.bias == 4.0)
    assert torch.all(gsa_.f_proj.bias == 3.0)
    assert build_mixer("gsa", 64, 4, fgate_bias_init=None).f_proj.bias is None
    m = build_mixer("gla", 64, 4, rgate_bias_init=0.5, fgate_bias_init=1.0)
    assert torch.all(m.r_proj.bias == 0.5) and torch.all(m.gk_up.bias == 1.0)
    for name, checks in (("gla", lambda l: torch.all(l.r_proj.bias == 2.0) and torch.all(l.gk_up.bias == 4.0)),
                         ("gsa", lambda l: torch.all(l.f_proj.bias == 3.0))):
        model = CausalLM(LMConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=2, mixer=name))
        assert all(checks(b.mixer) for b in model.blocks)


@pytest.mark.parametrize("variant", ["exp", "sig"])
def test_mlstm_layer_shapes(variant):
    m = build_mixer(f"mlstm_{variant}", 64, 4)
    assert m.variant == variant and m.d_qk == m.d_v // 2
    assert torch.all(m.i_proj.bias == -10.0)
    assert m.gate_softcap == 15.0
    x = 1e3 * torch.randn(1, 4, 64)
    i = m._inputs(x)[3]
    assert i.abs().max() <= 15.0


def test_softcap():
    x = torch.tensor([-1e4, -1.0, 0.0, 2.0, 1e4])
    y = softcap(x, 15.0)
    assert torch.allclose(y, 15 * torch.tanh(x / 15)) and y.abs().max() <= 15
    assert softcap(x, None) is x


def test_normalized_learnable_ab_and_retnet_learnable_decay():
    for name, kw, pnames in (("normalized", dict(learnable_ab=True), {"a", "b"}),
                             ("retnet", dict(learn_decay=True), {"decay_logit"})):
        m = make(name, **kw)
        y, _ = m(torch.randn(1, 20, D))
        y.sum().backward()
        grads = {n: p.grad for n, p in m.named_parameters() if n in pnames}
        assert set(grads) == pnames and all(g is not None and torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                              (torch.bfloat16, torch.float32), (torch.float16, None)])
def test_rmsnorm_float32_math_any_dtypes(x_dtype, w_dtype):
    """RMSNorm computes in float32 whatever the dtypes (fused F.rms_norm when x and the weight share one, the
    float32 expression otherwise, as under autocast), returns x's dtype, warns about nothing."""
    import warnings
    from ula.layers._base import RMSNorm
    seed = fresh_seed()
    n = RMSNorm(48, affine=w_dtype is not None)
    if w_dtype is not None:
        n.weight.data = torch.randn(48).to(w_dtype)
    x = (torch.randn(5, 7, 48) * 3).to(x_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = n(x)
    w = n.weight.double() if w_dtype is not None else 1.0
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + n.eps) * w
    assert y.dtype == x_dtype
    # float32 math: only the output's rounding to x's dtype remains
    assert rel(y, ref) <= (1e-6 if x_dtype == torch.float32 else 4e-3), seed


@pytest.mark.parametrize("name", list(MIXERS))
def test_float64_layer_is_float64_throughout(name):
    """A float64 layer keeps its gates and norms in float64 (not float32): steps and the chunk path agree to
    float64 rounding. Mamba2's dt and A were float32 (1e-7 apart at these weights, 1e-14 after), as were GLA's,
    GSA's, HGRN2's, mLSTM's and RetNet's gates."""
    seed = fresh_seed()
    m = make(name).double()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(4)  # larger projections: float32 rounding of a gate would show
    x = torch.randn(2, 37, D, dtype=torch.float64)
    with torch.no_grad():
        y, _ = m(x)
    ys, _ = stepped(m, x)
    assert y.dtype == torch.float64
    assert rel(ys, y) <= 1e-11, f"{name} seed {seed}: {rel(ys, y):.2e}"
    if hasattr(m, "_inputs"):  # what the layer hands its op: every tensor float64
        with torch.no_grad():
            dtypes = {t.dtype for t in tensors(m._inputs(x)) if t.is_floating_point()}
        assert dtypes == {torch.float64}, (name, dtypes)
    if hasattr(m, "_ld"):
        assert m._ld(x).dtype == torch.float64, name


@pytest.mark.parametrize("name", list(MIXERS))
@pytest.mark.parametrize("kw, arg", [(dict(d_model=0), "d_model"), (dict(d_model=-8), "d_model"),
                                     (dict(n_heads=0), "n_heads"), (dict(n_heads=2.0), "n_heads"),
                                     (dict(chunk_size=7), "chunk_size"), (dict(backend="foo"), "backend")])
def test_bad_constructor_arguments(name, kw, arg):
    """Every mixer (softmax attention too) refuses bad widths, heads, chunk sizes and backends when built, with
    the argument's name, not a ZeroDivisionError or an error at the first forward."""
    a = dict(d_model=D, n_heads=H, chunk_size=16, **SMALL.get(name, {}))
    a.update(kw)
    with pytest.raises(ValueError, match=arg):
        MIXERS[name](a.pop("d_model"), a.pop("n_heads"), **a)


def test_derived_width_named_with_its_formula():
    with pytest.raises(ValueError, match=r"d_k = int\(d_model · expand_k\) = int\(30 · 0.5\) = 15 must be divisible"):
        build_mixer("gla", 30, 4)
    with pytest.raises(ValueError, match=r"d_qk = int\(d_v · qk_ratio\)"):
        build_mixer("mlstm_exp", 36, 4, qk_ratio=0.5)
