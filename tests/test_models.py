"""The causal LM over every mixer: recurrent decoding == full forward, gradients, save/load, torch.compile,
overfitting a fixed batch, fixed-size generation caches, sampling, and the Hugging Face wrapper."""
import pytest
import torch
import torch.nn.functional as F

from helpers import SMALL_MIXER_KWARGS as SMALL, fresh_seed, rel
from ula.layers import LINEAR_MIXERS, MIXERS
from ula.models import CausalLM, LMConfig, sample_next

V = 64


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(name, **kw):
    cfg = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, mixer=name, logit_softcap=30.0,
               mixer_kwargs={"chunk_size": 16, **SMALL.get(name, {})})
    cfg.update(kw)
    return CausalLM(LMConfig(**cfg))


@pytest.mark.parametrize("name", list(MIXERS))
def test_step_logits_equal_full_forward(name):
    seed = fresh_seed()
    m = tiny(name).eval()
    ids = torch.randint(0, V, (2, 37))
    with torch.no_grad():
        full, _ = m(ids)
        # step by step from nothing
        cache, steps = None, []
        for t in range(ids.shape[1]):
            lg, cache = m.step(ids[:, t], cache)
            steps.append(lg)
        steps = torch.stack(steps, 1)
        # prefill with the chunk path, then steps through forward's one-token route
        pre, c2 = m(ids[:, :20])
        rest = []
        for t in range(20, ids.shape[1]):
            lg, c2 = m(ids[:, t:t + 1], c2)
            rest.append(lg)
        mixed = torch.cat([pre] + rest, 1)
    assert rel(steps, full) <= 1e-4, f"{name} seed {seed}: {rel(steps, full):.2e}"
    assert rel(mixed, full) <= 1e-4, f"{name} seed {seed}: {rel(mixed, full):.2e}"
    assert cache.seen_tokens == c2.seen_tokens == ids.shape[1]


@pytest.mark.parametrize("name", list(MIXERS))
def test_gradients_reach_every_parameter(name):
    fresh_seed()
    m = tiny(name)
    ids = torch.randint(0, V, (2, 24))
    logits, _ = m(ids)
    F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None, f"{name}: {pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {pname} has a non-finite gradient"
    assert sum(p.grad.abs().sum() for p in m.parameters()) > 0
    assert all(p.grad.abs().sum() > 0 for n, p in m.named_parameters() if n != "embed.weight"), \
        [n for n, p in m.named_parameters() if p.grad.abs().sum() == 0]


@pytest.mark.parametrize("name", list(MIXERS))
@pytest.mark.parametrize("tie", [False, True])
def test_save_load_round_trip(name, tie, tmp_path):
    fresh_seed()
    m = tiny(name, tie_embeddings=tie).eval()
    with torch.no_grad():   # move the weights off their initial values
        for p in m.parameters():
            p.add_(0.01 * torch.randn_like(p))
    m.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").exists() and (tmp_path / "model.safetensors").exists()
    m2 = CausalLM.from_pretrained(tmp_path).eval()
    assert m2.config == m.config
    if tie:
        assert m2.lm_head.weight is m2.embed.weight
    ids = torch.randint(0, V, (2, 19))
    with torch.no_grad():
        assert torch.equal(m(ids)[0], m2(ids)[0])
        assert torch.equal(m.generate(ids[:, :3], 6, greedy=True), m2.generate(ids[:, :3], 6, greedy=True))


@pytest.mark.parametrize("name", list(MIXERS))
def test_overfits_fixed_batch(name):
    torch.manual_seed(0)
    m = tiny(name, d_model=32, n_layers=1)
    ids = torch.randint(0, V, (4, 24))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    first = None
    for step in range(150):
        logits, _ = m(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        first = loss.item() if first is None else first
        if loss.item() < 0.1:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1, f"{name}: loss {first:.3f} -> {loss.item():.3f} after {step} steps"


@pytest.mark.parametrize("name", LINEAR_MIXERS)
def test_generation_cache_does_not_grow(name):
    fresh_seed()
    m = tiny(name).eval()
    ids = torch.randint(0, V, (2, 7))
    out5, c5 = m.generate(ids, 6, greedy=True, return_cache=True)   # 5 steps after the prefill
    out50, c50 = m.generate(ids, 51, greedy=True, return_cache=True)  # 50 steps
    assert c5.seen_tokens == 12 and c50.seen_tokens == 57
    assert c5.numel() == c50.numel() > 0
    assert torch.equal(out50[:, :out5.shape[1]], out5)


def test_softmax_cache_grows():
    m = tiny("softmax").eval()
    ids = torch.randint(0, V, (1, 4))
    _, c5 = m.generate(ids, 6, greedy=True, return_cache=True)
    _, c50 = m.generate(ids, 51, greedy=True, return_cache=True)
    assert c50.numel() > c5.numel()


def test_generate_greedy_and_sampling():
    torch.manual_seed(0)
    m = tiny("gla").eval()
    ids = torch.randint(0, V, (3, 5))
    greedy = m.generate(ids, 10, greedy=True)
    # greedy == a manual argmax loop over full forwards
    seq = ids
    with torch.no_grad():
        for _ in range(10):
            seq = torch.cat([seq, m(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(greedy, seq)
    assert torch.equal(m.generate(ids, 10, top_k=1), greedy)
    assert torch.equal(m.generate(ids, 10, top_p=1e-6), greedy)
    assert torch.equal(m.generate(ids, 10, temperature=0), greedy)
    g1 = m.generate(ids, 10, temperature=0.8, top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(3))
    g2 = m.generate(ids, 10, temperature=0.8, top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(3))
    assert torch.equal(g1, g2) and g1.shape == (3, 15)
    eos = int(greedy[0, 6])
    out = m.generate(ids[:1], 10, greedy=True, eos_token_id=eos)
    assert out[0, -1] == eos and out.shape[1] <= 15


def test_sample_next_filters():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next(logits, top_k=2, generator=g) for _ in range(200)])
    assert set(draws.flatten().tolist()) <= {2, 3}
    draws = torch.stack([sample_next(logits, top_p=0.5, generator=g) for _ in range(200)])
    assert set(draws.flatten().tolist()) == {3}   # p(3) = 0.64 >= 0.5 alone


@pytest.mark.parametrize("kw, arg", [(dict(n_heads=0), "n_heads"), (dict(d_model=-8), "d_model"),
                                     (dict(n_layers=0), "n_layers"), (dict(vocab_size=0), "vocab_size"),
                                     (dict(mlp_multiple_of=0), "mlp_multiple_of"), (dict(d_model="32"), "d_model"),
                                     (dict(logit_softcap=0.0), "logit_softcap"),
                                     (dict(logit_softcap=-30.0), "logit_softcap"), (dict(mlp_ratio=0), "mlp_ratio")])
def test_bad_config(kw, arg):
    """Sizes and the logit cap are checked when the config is made (a cap of 0 made every logit 0, n_layers 0 a
    model with no blocks, n_heads 0 a ZeroDivisionError)."""
    with pytest.raises(ValueError, match=f"LMConfig: {arg} must be"):
        LMConfig(**kw)


def test_generate_refuses_bad_sampling_and_empty_prompts():
    m = tiny("softmax").eval()
    ids = torch.randint(0, V, (2, 5))
    for kw, what in [(dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_k=-1), "top_k")]:
        with pytest.raises(ValueError, match=what):
            m.generate(ids, 3, **kw)
        with pytest.raises(ValueError, match=what):
            sample_next(torch.randn(2, V), **kw)
    for empty in (ids[:, :0], ids[0]):
        with pytest.raises(ValueError, match="input_ids must be"):
            m.generate(empty, 3)


def test_unknown_mixer_and_config_round_trip():
    with pytest.raises(ValueError, match="unknown mixer"):
        CausalLM(LMConfig(mixer="nope"))
    cfg = LMConfig(mixer="gsa", mixer_kwargs={"num_slots": 8}, logit_softcap=30.0)
    assert LMConfig.from_dict(cfg.to_dict()) == cfg


# ---- torch.compile (last: compiling leaves state behind) -----------------------------------------------

@pytest.mark.parametrize("name", list(MIXERS))
def test_torch_compile(name):
    """Dynamo + AOTAutograd (backend aot_eager keeps it fast on CPU), forward and backward."""
    fresh_seed()
    torch._dynamo.reset()
    m = tiny(name, n_layers=1)
    ids = torch.randint(0, V, (2, 20))
    ref, _ = m(ids)
    cm = torch.compile(m, backend="aot_eager")
    out, _ = cm(ids)
    out.float().square().mean().backward()
    assert rel(out, ref) <= 1e-5
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    torch._dynamo.reset()


def test_torch_compile_inductor():
    """One mixer through the default (inductor) backend, which generates C++ on the CPU."""
    import torch._inductor.config as inductor_config
    torch.manual_seed(0)
    torch._dynamo.reset()
    inductor_config.compile_threads = 1   # no pool of compile workers competing for the CPU cores
    m = tiny("retnet", n_layers=1)
    ids = torch.randint(0, V, (2, 20))
    ref, _ = m(ids)
    out, _ = torch.compile(m)(ids)
    assert rel(out, ref) <= 1e-4
    torch._dynamo.reset()


# ---- Hugging Face -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,tie", [("gla", False), ("mlstm_exp", True), ("softmax", False)])
def test_hf_from_config_generate_matches(name, tie, tmp_path):
    pytest.importorskip("transformers")
    import ula.models.hf  # noqa: F401  registers "ula"
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("ula", vocab_size=V, d_model=32, n_layers=2, n_heads=4, mixer=name,
                               tie_word_embeddings=tie, mixer_kwargs=SMALL.get(name, {}))
    model = AutoModelForCausalLM.from_config(cfg).eval()
    assert type(model).__name__ == "UlaForCausalLM"
    ids = torch.randint(0, V, (2, 6))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                         pad_token_id=0)
    assert torch.equal(out, model.model.generate(ids, 12, greedy=True))
    lbl = model(ids, labels=ids)
    assert lbl.loss is not None and torch.isfinite(lbl.loss)
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
