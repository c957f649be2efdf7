"""Static decoding (issue 5): a StaticStateCache updated in place gives the logits of the eager step path for
every mixer; the static step makes no host transfer or synchronization (what a CUDA graph needs), checked on
the meta device; generate's static branch keeps greedy decoding, sampling and eos; CUDA graphs where CUDA is."""
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from helpers import DEVICE, fresh_seed, rel
from test_models import V, tiny as tiny_lm
from ula.layers import MIXERS
from ula.layers._base import map_state, state_tensors
from ula.models import StaticStateCache
from ula.models.cuda_graph import GraphedDecoder

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(name, **kw):
    return tiny_lm(name, **kw).eval()


@pytest.mark.parametrize("name", list(MIXERS))
@torch.no_grad()
def test_static_step_equals_step(name):
    """Prefill, then 24 steps three ways: the eager StateCache, a GraphedDecoder run eagerly (bounds 8, 16, 32
    for softmax: the bound changes on the way) and CausalLM.step on a StaticStateCache."""
    seed = fresh_seed()
    m = tiny(name)
    ids = torch.randint(0, V, (2, 5))
    logits, cache = m(ids)
    dec = GraphedDecoder(m, cache, 5 + 24, capture=False, min_bound=8)
    static = m.static_cache(cache, 5 + 24, min_bound=8)
    tok = logits[:, -1].argmax(-1)
    for i in range(24):
        ref, cache = m.step(tok, cache)
        a = dec(tok)
        b, static = m.step(tok, static)
        assert rel(a, ref) <= 1e-5 and rel(b, ref) <= 1e-5, f"{name} seed {seed} step {i}: {rel(a, ref):.2e}"
        tok = torch.randint(0, V, (2,))
    assert dec.cache.seen_tokens == static.seen_tokens == cache.seen_tokens == 29
    assert int(dec.cache.position) == 29
    if name == "softmax":
        assert dec.cache.bounds == [8, 16, 32, 64]   # max_len 29 rounded up to 64
        for buf, kv in zip(state_tensors(dec.cache.states), state_tensors(cache.states)):
            assert rel(buf[:, :, :29], kv) <= 1e-6 and not buf[:, :, 29:].any()
    else:
        assert dec.cache.bounds is None
        for buf, s in zip(state_tensors(dec.cache.states), state_tensors(cache.states)):
            assert rel(buf, s) <= 1e-5, f"{name} seed {seed}: final states differ"


class HostTraffic(TorchDispatchMode):
    """Records host synchronizations (.item(), bool()) and copies of host tensors to the device."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        copy = func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)
        host = [t for t in ins if t.device.type == "cpu" and (copy or t.dim() > 0)]   # 0-d: a plain number
        if func is torch.ops.aten._local_scalar_dense.default or (host and any(t.is_meta for t in outs)):
            self.seen.append(str(func))
        return out


@pytest.mark.parametrize("name", list(MIXERS))
@torch.no_grad()
def test_static_step_capturable(name, monkeypatch):
    """The static step on the meta device: no host synchronization, no tensor made from host data or copied
    from the host (a CUDA graph captures neither), and the output has the eager shape."""
    fresh_seed()
    m = tiny(name)
    _, cache = m(torch.randint(0, V, (2, 5)))
    static = m.static_cache(cache, 40, min_bound=8)
    m.to("meta")
    static.states = [map_state(lambda t: t.to("meta"), s) for s in static.states]
    static.position = static.position.to("meta")
    made = []

    def spy(real):
        def f(data, *a, **kw):
            dev = kw.get("device")
            if dev is not None and torch.device(dev).type != "cpu" and not isinstance(data, torch.Tensor):
                made.append(f"{real.__name__}({data!r})")
            return real(data, *a, **kw)
        return f
    monkeypatch.setattr(torch, "tensor", spy(torch.tensor))
    monkeypatch.setattr(torch, "as_tensor", spy(torch.as_tensor))
    with HostTraffic() as mode:
        for _ in range(2):   # the first call may fill per-device caches; the second is what a graph captures
            made.clear()
            mode.seen.clear()
            out = m.step_static(torch.zeros(2, dtype=torch.long, device="meta"), static, 16)
    assert out.shape == (2, V)
    assert not mode.seen and not made, f"{name}: host traffic in the static step: {mode.seen + made}"


def test_static_cache_bounds_and_errors():
    m = tiny("softmax")
    with torch.no_grad():
        full, _ = m(torch.randint(0, V, (1, 1)))
        _, cache = m(torch.randint(0, V, (1, 3)))
        s = m.static_cache(cache, 300)
        assert s.max_len == 320 and s.bounds == [256, 320] and s.bound_for(4) == 256 and s.bound_for(257) == 320
        with pytest.raises(ValueError, match="holds 320 tokens"):
            s.bound_for(321)
        with pytest.raises(ValueError, match="no room"):
            m.static_cache(cache, 3)
        with pytest.raises(TypeError):
            m.static_cache(s, 400)
        lin = tiny("gla")
        _, c = lin(torch.randint(0, V, (1, 3)))
        assert lin.static_cache(c, 300).bound_for(300) is None
    assert isinstance(s, StaticStateCache) and "of 320 tokens" in repr(s)


@pytest.mark.parametrize("name", ["gla", "softmax"])
@torch.no_grad()
def test_forward_and_reload_on_static_cache(name):
    """forward with several tokens on a static cache == the full forward; load restarts from a prefill."""
    seed = fresh_seed()
    m = tiny(name)
    ids = torch.randint(0, V, (2, 20))
    full, _ = m(ids)
    pre, cache = m(ids[:, :6])
    dec = GraphedDecoder(m, cache, 20, capture=False, min_bound=4)
    rest, static = m(ids[:, 6:], dec.cache)
    assert static is dec.cache and static.seen_tokens == 20
    assert rel(torch.cat([pre, rest], 1), full) <= 1e-5, f"{name} seed {seed}"
    dec.load(cache)
    assert dec.cache.seen_tokens == 6 and int(dec.cache.position) == 6
    again = torch.stack([dec(t) for t in ids[:, 6:].unbind(1)], 1)
    assert rel(again, full[:, 6:]) <= 1e-5, f"{name} seed {seed}"


@pytest.mark.parametrize("name", ["gla", "softmax"])
def test_generate_static_branch(name, monkeypatch):
    """generate through its CUDA-graph branch (the decoder run eagerly on the CPU): the tokens of the eager
    branch for greedy decoding, seeded sampling (temperature, top-k, top-p) and eos; a static cache back."""
    torch.manual_seed(0)
    m = tiny(name)
    ids = torch.randint(0, V, (3, 5))
    eager = dict(greedy=m.generate(ids, 12, greedy=True, cuda_graph=False),
                 sample=m.generate(ids, 12, temperature=0.8, top_k=20, top_p=0.9, cuda_graph=False,
                                   generator=torch.Generator().manual_seed(3)))
    used = []

    def no_capture(cache, max_len):
        used.append(max_len)
        return GraphedDecoder(m, cache, max_len, capture=False, min_bound=8)
    monkeypatch.setattr(m, "_graph_or_warn", no_capture)
    out, cache = m.generate(ids, 12, greedy=True, cuda_graph=True, return_cache=True)
    assert torch.equal(out, eager["greedy"]) and used == [16]
    assert isinstance(cache, StaticStateCache) and cache.seen_tokens == 16
    s = m.generate(ids, 12, temperature=0.8, top_k=20, top_p=0.9, cuda_graph=True,
                   generator=torch.Generator().manual_seed(3))
    assert torch.equal(s, eager["sample"])
    eos = int(eager["greedy"][0, 8])
    a = m.generate(ids[:1], 12, greedy=True, eos_token_id=eos, cuda_graph=True)
    b = m.generate(ids[:1], 12, greedy=True, eos_token_id=eos, cuda_graph=False)
    assert torch.equal(a, b) and a[0, -1] == eos


def test_generate_cuda_graph_on_cpu_warns():
    torch.manual_seed(0)
    m = tiny("gla")
    ids = torch.randint(0, V, (1, 4))
    with pytest.warns(RuntimeWarning, match="CUDA graphs need a CUDA device"):
        out = m.generate(ids, 5, greedy=True, cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(m.generate(ids, 5, greedy=True), out)   # default off on the CPU: no warning


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU and kernels compiled for it (ULA_TEST_GPU=1)")
@pytest.mark.parametrize("name", list(MIXERS))
def test_cuda_graph_generate_equals_eager(name):
    torch.manual_seed(0)
    m = tiny(name).cuda()
    ids = torch.randint(0, V, (2, 5), device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, cache = m.generate(ids, 40, greedy=True, cuda_graph=True, return_cache=True)
    assert not [w for w in caught if "cuda_graph" in str(w.message)], "the capture failed: decoded eagerly"
    assert isinstance(cache, StaticStateCache)
    with torch.no_grad():
        logits, c = m(ids)
        dec = GraphedDecoder(m, c, 45)
        tok = logits[:, -1].argmax(-1)
        for _ in range(30):
            ref, c = m.step(tok, c)
            assert rel(dec(tok), ref) <= 1e-5
            tok = ref.argmax(-1)
    assert torch.equal(out, m.generate(ids, 40, greedy=True, cuda_graph=False))
