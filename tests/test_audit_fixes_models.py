"""Audit fixes in the models, layers and the `ula` command: the HF wrapper decodes from its recurrent cache
under transformers 5's `cache` name, softmax attention refuses an odd head dim at construction (one-line
CLI error, no folder left), `ula bench --kinds` takes spaced lists, the latest checkpoint is the highest
step, top_k=0 means no top-k cut."""
import os

import pytest
import torch

from ula.cli import main
from ula.layers import SoftmaxAttentionLayer
from ula.models import CausalLM, LMConfig, sample_next
from ula.models.lm import StateCache
from ula.train import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def keep_threads():
    """The commands set torch's thread count (--threads); later tests get theirs back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _rc_and_err(capsys, argv):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    return rc, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


# ---- 1. HF generate: one prefill, then one token per step from the StateCache ---------------------------
@pytest.fixture
def hf_model():
    pytest.importorskip("transformers")
    import ula.models.hf  # noqa: F401  registers "ula"
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("ula", mixer="gla", d_model=32, n_layers=2, n_heads=2, vocab_size=50)
    return AutoModelForCausalLM.from_config(cfg).eval()


def test_hf_generate_prefills_once_then_steps_with_the_cache(hf_model):
    seen = []
    inner = hf_model.model.forward

    def spy(input_ids, cache=None, cu_seqlens=None):
        seen.append((input_ids.shape[1], None if cache is None else cache.seen_tokens))
        return inner(input_ids, cache, cu_seqlens)

    hf_model.model.forward = spy
    ids = torch.randint(0, 50, (2, 6))
    out = hf_model.generate(ids, max_new_tokens=5, do_sample=False)
    assert seen == [(6, None), (1, 6), (1, 7), (1, 8), (1, 9)]
    del hf_model.model.forward
    assert torch.equal(out, hf_model.model.generate(ids, 5, greedy=True))


def test_hf_forward_takes_the_cache_under_both_names(hf_model):
    from transformers.modeling_outputs import CausalLMOutputWithPast
    from ula.models import hf
    assert hf._CACHE in CausalLMOutputWithPast.__dataclass_fields__  # the name generate reads back (5.x: "cache")
    ids = torch.randint(0, 50, (1, 9))
    with torch.no_grad():
        full = hf_model(ids).logits
        for name in ("cache", "past_key_values"):
            head = hf_model(ids[:, :4])[hf._CACHE]
            assert isinstance(head, StateCache) and head.seen_tokens == 4
            rest = hf_model(ids[:, 4:], **{name: head})
            assert rest[hf._CACHE].seen_tokens == 9
            torch.testing.assert_close(rest.logits, full[:, 4:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mixer", ["gla", "softmax"])
def test_hf_generate_continues_from_a_cache_passed_in(mixer):
    """generate(ids, cache=<the StateCache of a prefix>) continues from it (transformers 5 asks the cache for
    is_compileable and is_linear) and gives generate's tokens from scratch; the model sees only the unseen tokens.
    The cache goes in under the name the installed transformers uses (cache= from 5.2x, past_key_values= before)."""
    pytest.importorskip("transformers")
    import ula.models.hf as hf
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("ula", mixer=mixer, d_model=32, n_layers=2, n_heads=2, vocab_size=50)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 50, (1, 6))
    full = model.generate(ids, max_new_tokens=5, do_sample=False)
    with torch.no_grad():
        head = model(ids[:, :5])[hf._CACHE]
    seen = []
    inner = model.model.forward

    def spy(input_ids, cache=None, cu_seqlens=None):
        seen.append(input_ids.shape[1])
        return inner(input_ids, cache, cu_seqlens)

    model.model.forward = spy
    cont = model.generate(ids, max_new_tokens=5, do_sample=False, **{hf._CACHE: head})
    assert seen == [1] * 5
    assert torch.equal(cont, full)


# ---- 2. softmax attention with an odd head dim ----------------------------------------------------------
def test_softmax_odd_head_dim_is_refused_at_construction():
    with pytest.raises(ValueError, match="head dim d_model / n_heads = 15 must be even"):
        SoftmaxAttentionLayer(30, 2)
    y, _ = SoftmaxAttentionLayer(30, 2, use_rope=False)(torch.randn(1, 5, 30))   # no RoPE: no pairing needed
    assert y.shape == (1, 5, 30)


@pytest.mark.parametrize("argv", [
    ["train", "--mixer", "softmax", "--d-model", "30", "--heads", "2", "--layers", "1", "--steps", "1",
     "--device", "cpu", "--threads", "1"],
    ["demo", "--tiny", "--mixers", "softmax", "--d-model", "18", "--device", "cpu", "--threads", "1"]])
def test_cli_odd_softmax_head_dim_is_one_line_and_writes_nothing(tmp_path, capsys, argv):
    out = tmp_path / "out"
    rc, err = _rc_and_err(capsys, argv + ["--out", out])
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"ula {argv[0]}: error: "), err
    assert "must be even" in err[0] and not out.exists()


def test_train_failing_before_its_first_checkpoint_leaves_no_folder(tmp_path, monkeypatch):
    import ula.train.loop as loop

    def broken(*a, **k):
        raise RuntimeError("first step fails")

    monkeypatch.setattr(loop, "train_batch", broken)
    (tmp_path / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 20)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="first step fails"):
        main(["train", str(tmp_path / "text.txt"), "--d-model", "16", "--heads", "2", "--layers", "1",
              "--seq-len", "16", "--batch-size", "2", "--steps", "1", "--device", "cpu", "--threads", "1",
              "--out", str(out)])
    assert not out.exists()


# ---- 3. ula bench --kinds with spaces and empty items -----------------------------------------------------
@pytest.mark.parametrize("kinds,want", [("none, scalar", ["none", "scalar"]), ("none,", ["none"]),
                                        (" vector ,, none", ["vector", "none"])])
def test_bench_kinds_are_stripped(tmp_path, monkeypatch, kinds, want):
    import ula.bench.runner as runner
    got = {}
    monkeypatch.setattr(runner, "run_bench", lambda out, **kw: got.update(kw))
    assert main(["bench", "--kinds", kinds, "--seq-lens", " 32, 64,", "--device", "cpu", "--threads", "1",
                 "--out", str(tmp_path / "b")]) == 0
    assert got["kinds"] == want and got["seq_lens"] == [32, 64]


# ---- 4. the latest checkpoint is the highest step, not the last name ------------------------------------
def test_find_picks_the_highest_step(tmp_path):
    for s in (999_900, 1_000_000, 5):
        os.makedirs(tmp_path / "checkpoints" / f"step-{s:06d}")
    os.makedirs(tmp_path / "checkpoints" / ".step-2000000.123-ab.tmp")   # an unfinished save: not a checkpoint
    assert os.path.basename(ckpt.find(str(tmp_path))) == "step-1000000"


# ---- 5. top_k 0 / None: no cut; negative: ValueError ------------------------------------------------------
def test_top_k_zero_means_no_cut():
    logits = torch.randn(3, 11)
    for k in (0, None):
        g = torch.Generator().manual_seed(1)
        tok = sample_next(logits, top_k=k, generator=g)
        ref = torch.multinomial(logits.softmax(-1), 1, generator=torch.Generator().manual_seed(1)).squeeze(-1)
        assert torch.equal(tok, ref)
    with pytest.raises(ValueError, match="top_k"):
        sample_next(logits, top_k=-1)
    with pytest.raises(ValueError, match="top_k"):
        sample_next(logits, top_k=-2, greedy=True)


def test_generate_top_k_zero():
    torch.manual_seed(0)
    m = CausalLM(LMConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, mixer="retnet")).eval()
    ids = torch.randint(0, 20, (2, 4))
    out = m.generate(ids, 3, top_k=0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, m.generate(ids, 3, top_k=None, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="top_k"):
        m.generate(ids, 3, top_k=-1)
