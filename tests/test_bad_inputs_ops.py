"""A catalogue of bad inputs for every public function of ula.ops (ula/ops/__init__.py): wrong rank, wrong gate
shape, wrong dtype, bad variant string, bad cu_seqlens, malformed states. Each must raise the documented
exception type early (not from deep inside a matmul) with a message that names the argument."""
import re

import pytest
import torch

import ula
import ula.ops

B, T, H, K, V, M = 2, 10, 3, 8, 6, 5


def _seq(Bn=B):
    return dict(q=torch.randn(Bn, T, H, K), k=torch.randn(Bn, T, H, K), v=torch.randn(Bn, T, H, V))


def _tok():
    return dict(q=torch.randn(B, H, K), k=torch.randn(B, H, K), v=torch.randn(B, H, V))


def _lg(*shape):
    return -torch.rand(*shape)


# One good call per public function; a case overrides some of its arguments.
GOOD = {
    "gla": lambda: dict(**_seq(), g=_lg(B, T, H, K)),
    "gla_step": lambda: dict(**_tok(), g=_lg(B, H, K), state=torch.randn(B, H, K, V)),
    "mlstm": lambda: dict(**_seq(), i=torch.randn(B, T, H), f=torch.randn(B, T, H)),
    "mlstm_step": lambda: dict(**_tok(), i=torch.randn(B, H), f=torch.randn(B, H)),
    "normalized_linear_attention": lambda: dict(**_seq()),
    "normalized_linear_attention_step": lambda: dict(**_tok()),
    "gsa": lambda: dict(**_seq(), g=_lg(B, T, H, M)),
    "gsa_step": lambda: dict(**_tok(), g=_lg(B, H, M)),
    "abc": lambda: dict(**_seq(), w=torch.randn(B, T, H, M)),
    "abc_step": lambda: dict(**_tok(), w=torch.randn(B, H, M)),
    "linear_attn": lambda: dict(**_seq()),
    "linear_attn_step": lambda: dict(**_tok()),
    "retention": lambda: dict(**_seq(), ld=_lg(H)),
    "retention_step": lambda: dict(**_tok(), ld=_lg(H)),
    "retnet_log_decay": lambda: dict(H=H),
    "mamba2": lambda: dict(**_seq(), dt=torch.rand(B, T, H), A=-torch.rand(H) - 0.1),
    "mamba2_step": lambda: dict(**_tok(), dt=torch.rand(B, H), A=-torch.rand(H) - 0.1),
    "hgrn2": lambda: dict(q=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V), g=_lg(B, T, H, K)),
    "hgrn2_step": lambda: dict(q=torch.randn(B, H, K), v=torch.randn(B, H, V), g=_lg(B, H, K)),
    "recurrent_step": lambda: dict(**_tok(), ld=_lg(B, H, K), rd=_lg(B, H, V), state=torch.randn(B, H, K, V)),
}

# Packed (varlen) good calls, for the cu_seqlens cases: B == 1, two sequences.
PACKED = {
    "gla": lambda: dict(**_seq(1), g=_lg(1, T, H, K)),
    "mlstm": lambda: dict(**_seq(1), i=torch.randn(1, T, H), f=torch.randn(1, T, H)),
    "normalized_linear_attention": lambda: dict(**_seq(1)),
    "gsa": lambda: dict(**_seq(1), g=_lg(1, T, H, M)),
    "abc": lambda: dict(**_seq(1), w=torch.randn(1, T, H, M)),
    "linear_attn": lambda: dict(**_seq(1)),
    "retention": lambda: dict(**_seq(1), ld=_lg(H)),
    "mamba2": lambda: dict(**_seq(1), dt=torch.rand(1, T, H), A=-torch.rand(H) - 0.1),
    "hgrn2": lambda: dict(q=torch.randn(1, T, H, K), v=torch.randn(1, T, H, V), g=_lg(1, T, H, K)),
}

# (function, case id, overrides (name -> value, or a callable of the good arguments), exception, argument named)
I64 = torch.int64
CASES = [
    # --- gla
    ("gla", "q rank 3", dict(q=torch.randn(B, T, H * K)), ValueError, "q"),
    ("gla", "k shape", dict(k=torch.randn(B, T, H, K + 1)), ValueError, "k"),
    ("gla", "v int dtype", dict(v=torch.ones(B, T, H, V, dtype=I64)), TypeError, "v"),
    ("gla", "g scalar shape", dict(g=_lg(B, T, H)), ValueError, "g"),
    ("gla", "g wrong K", dict(g=_lg(B, T, H, K - 1)), ValueError, "g"),
    ("gla", "g int dtype", dict(g=torch.zeros(B, T, H, K, dtype=I64)), TypeError, "g"),
    ("gla", "g None", dict(g=None), TypeError, "g"),
    ("gla", "g positive", dict(g=torch.full((B, T, H, K), 0.5)), ValueError, "g"),
    ("gla", "g nan", dict(g=torch.full((B, T, H, K), float("nan"))), ValueError, "g"),
    ("gla", "state shape", dict(initial_state=torch.randn(B, H, V, K)), ValueError, "initial_state"),
    ("gla", "chunk size", dict(chunk_size=48), ValueError, "chunk_size"),
    ("gla", "backend", dict(backend="cuda"), ValueError, "backend"),
    ("gla", "scale", dict(scale="x"), TypeError, "scale"),
    ("gla_step", "q rank 4", dict(q=torch.randn(B, 1, H, K)), ValueError, "q"),
    ("gla_step", "g shape", dict(g=_lg(B, H, K + 1)), ValueError, "g"),
    ("gla_step", "g int", dict(g=torch.zeros(B, H, K, dtype=I64)), TypeError, "g"),
    ("gla_step", "state shape", dict(state=torch.randn(B, H, V, K)), ValueError, "state"),
    ("gla_step", "v batch", dict(v=torch.randn(B + 1, H, V)), ValueError, "v"),
    ("gla_step", "k dtype", dict(k=torch.randn(B, H, K, dtype=torch.float64)), TypeError, "k"),
    ("gla_step", "scale string", dict(scale="x"), TypeError, "scale"),
    ("gla_step", "scale inf", dict(scale=float("inf")), TypeError, "scale"),
    # --- mlstm
    ("mlstm", "q rank 3", dict(q=torch.randn(B, T, H * K)), ValueError, "q"),
    ("mlstm", "variant string", dict(variant="tanh"), ValueError, "variant"),
    ("mlstm", "variant not str", dict(variant=1), ValueError, "variant"),
    ("mlstm", "eps None", dict(eps=None), TypeError, "eps"),
    ("mlstm", "eps string", dict(eps="1e-6"), TypeError, "eps"),
    ("mlstm", "eps negative", dict(eps=-1.0), ValueError, "eps"),
    ("mlstm", "eps tensor", dict(eps=torch.tensor([1e-6, 1e-6])), TypeError, "eps"),
    ("mlstm", "exp state n dtype", dict(initial_state=(torch.randn(B, H, K, V), torch.randn(B, H, K).half(),
                                                       torch.randn(B, H))), TypeError, "n"),
    ("mlstm", "i shape", dict(i=torch.randn(B, T, H, 1)), ValueError, "i"),
    ("mlstm", "f shape", dict(f=torch.randn(B, T)), ValueError, "f"),
    ("mlstm", "i int", dict(i=torch.zeros(B, T, H, dtype=I64)), TypeError, "i"),
    ("mlstm", "f list", dict(f=[0.0] * T), TypeError, "f"),
    ("mlstm", "exp state not tuple", dict(initial_state=torch.randn(B, H, K, V)), ValueError, "state"),
    ("mlstm", "exp state C shape", dict(initial_state=(torch.randn(B, H, V, K), torch.randn(B, H, K), torch.randn(B, H))),
     ValueError, "C"),
    ("mlstm", "exp state n shape", dict(initial_state=(torch.randn(B, H, K, V), torch.randn(B, H, V), torch.randn(B, H))),
     ValueError, "n"),
    ("mlstm", "exp state m shape", dict(initial_state=(torch.randn(B, H, K, V), torch.randn(B, H, K), torch.randn(B, H, 1))),
     ValueError, "m"),
    ("mlstm", "sig state tuple", dict(variant="sig", initial_state=(torch.randn(B, H, K, V),)), TypeError, "state"),
    ("mlstm", "sig state shape", dict(variant="sig", initial_state=torch.randn(B, H, K, V + 1)), ValueError, "state"),
    ("mlstm_step", "variant", dict(variant="softmax"), ValueError, "variant"),
    ("mlstm_step", "eps string", dict(eps="x"), TypeError, "eps"),
    ("mlstm_step", "scale string", dict(scale="x"), TypeError, "scale"),
    ("mlstm_step", "exp state C dtype", dict(state=(torch.randn(B, H, K, V).double(), torch.randn(B, H, K),
                                                    torch.randn(B, H))), TypeError, "C"),
    ("mlstm_step", "q rank", dict(q=torch.randn(B, 1, H, K)), ValueError, "q"),
    ("mlstm_step", "i shape", dict(i=torch.randn(B, H + 1)), ValueError, "i"),
    ("mlstm_step", "f int", dict(f=torch.zeros(B, H, dtype=I64)), TypeError, "f"),
    ("mlstm_step", "exp state tensor", dict(state=torch.randn(B, H, K, V)), ValueError, "state"),
    ("mlstm_step", "sig state shape", dict(variant="sig", state=torch.randn(B, H, K)), ValueError, "state"),
    # --- normalized
    ("normalized_linear_attention", "q rank 3", dict(q=torch.randn(B, T, H * K)), ValueError, "q"),
    ("normalized_linear_attention", "k shape", dict(k=torch.randn(B, T, H, K - 1)), ValueError, "k"),
    ("normalized_linear_attention", "v dtype", dict(v=torch.randn(B, T, H, V).double()), TypeError, "v"),
    ("normalized_linear_attention", "a wrong H", dict(a=torch.ones(H + 1)), ValueError, "a"),
    ("normalized_linear_attention", "b 2-D", dict(b=torch.ones(H, 1)), ValueError, "b"),
    ("normalized_linear_attention", "a string", dict(a="one"), TypeError, "a"),
    ("normalized_linear_attention", "b int tensor", dict(b=torch.ones(H, dtype=I64)), TypeError, "b"),
    ("normalized_linear_attention", "state shape [B,H,K,V]", dict(initial_state=torch.randn(B, H, K, V)), ValueError,
     "initial_state"),
    ("normalized_linear_attention", "chunk size", dict(chunk_size=0), ValueError, "chunk_size"),
    ("normalized_linear_attention", "eps None", dict(eps=None), TypeError, "eps"),
    ("normalized_linear_attention", "eps zero", dict(eps=0.0), ValueError, "eps"),
    ("normalized_linear_attention", "a nan", dict(a=float("nan")), ValueError, "a"),
    ("normalized_linear_attention", "b inf", dict(b=float("inf")), ValueError, "b"),
    ("normalized_linear_attention", "qk_l2_norm string", dict(qk_l2_norm="no"), TypeError, "qk_l2_norm"),
    ("normalized_linear_attention_step", "q rank", dict(q=torch.randn(B, 1, H, K)), ValueError, "q"),
    ("normalized_linear_attention_step", "state shape", dict(state=torch.randn(B, H, K, V)), ValueError, "state"),
    ("normalized_linear_attention_step", "a wrong H", dict(a=torch.ones(H + 2)), ValueError, "a"),
    ("normalized_linear_attention_step", "eps negative", dict(eps=-1e-6), ValueError, "eps"),
    # --- gsa
    ("gsa", "neither s nor g", dict(g=None), ValueError, "g"),
    ("gsa", "q rank", dict(q=torch.randn(B, T, H * K)), ValueError, "q"),
    ("gsa", "g wrong T", dict(g=_lg(B, T - 1, H, M)), ValueError, "g"),
    ("gsa", "g rank 3", dict(g=_lg(B, T, H)), ValueError, "g"),
    ("gsa", "s and g disagree", dict(s=torch.rand(B, T, H, M + 1)), ValueError, "g"),
    ("gsa", "s int", dict(g=None, s=torch.ones(B, T, H, M, dtype=I64)), TypeError, "s"),
    ("gsa", "g positive", dict(g=torch.full((B, T, H, M), 0.1)), ValueError, "g"),
    ("gsa", "g -inf", dict(g=torch.full((B, T, H, M), float("-inf"))), ValueError, "g"),
    ("gsa", "state not tuple", dict(initial_state=torch.randn(B, H, K, M)), ValueError, "state"),
    ("gsa", "state part 0 shape", dict(initial_state=(torch.randn(B, H, M, K), torch.randn(B, H, M, V))), ValueError,
     "state[0]"),
    ("gsa", "state part 1 shape", dict(initial_state=(torch.randn(B, H, K, M), torch.randn(B, H, V, M))), ValueError,
     "state[1]"),
    ("gsa_step", "q rank", dict(q=torch.randn(B, 1, H, K)), ValueError, "q"),
    ("gsa_step", "g shape", dict(g=_lg(B, H + 1, M)), ValueError, "g"),
    ("gsa_step", "s disagrees", dict(s=torch.rand(B, H, M - 1)), ValueError, "g"),
    ("gsa_step", "state length", dict(state=(torch.randn(B, H, K, M),)), ValueError, "state"),
    ("gsa_step", "scale string", dict(scale="x"), TypeError, "scale"),
    # --- abc
    ("abc", "w rank 3", dict(w=torch.randn(B, T, H)), ValueError, "w"),
    ("abc", "w wrong T", dict(w=torch.randn(B, T + 1, H, M)), ValueError, "w"),
    ("abc", "w int", dict(w=torch.zeros(B, T, H, M, dtype=I64)), TypeError, "w"),
    ("abc", "w None", dict(w=None), TypeError, "w"),
    ("abc", "w -inf", dict(w=torch.full((B, T, H, M), float("-inf"))), ValueError, "w"),
    ("abc", "state of 2", dict(initial_state=(torch.randn(B, H, K, M), torch.randn(B, H, M, V))), ValueError, "state"),
    ("abc", "state z shape", dict(initial_state=(torch.randn(B, H, K, M), torch.randn(B, H, M, V), torch.randn(B, H))),
     ValueError, "state[2]"),
    ("abc_step", "w rank", dict(w=torch.randn(B, M)), ValueError, "w"),
    ("abc_step", "state of 1", dict(state=(torch.randn(B, H, K, M),)), ValueError, "state"),
    ("abc_step", "scale tensor", dict(scale=torch.tensor(0.5)), TypeError, "scale"),
    # --- linear_attn
    ("linear_attn", "q rank", dict(q=torch.randn(B, T, H * K)), ValueError, "q"),
    ("linear_attn", "q not tensor", dict(q=[[1.0]]), TypeError, "q"),
    ("linear_attn", "v wrong T", dict(v=torch.randn(B, T + 1, H, V)), ValueError, "v"),
    ("linear_attn", "state dtype", dict(initial_state=torch.randn(B, H, K, V).half()), TypeError, "initial_state"),
    ("linear_attn_step", "q rank", dict(q=torch.randn(B, 1, H, K)), ValueError, "q"),
    ("linear_attn_step", "k shape", dict(k=torch.randn(B, H, K + 1)), ValueError, "k"),
    ("linear_attn_step", "state shape", dict(state=torch.randn(B, H, V, K)), ValueError, "state"),
    ("linear_attn_step", "scale bool", dict(scale=True), TypeError, "scale"),
    # --- retention
    ("retention", "ld [B,T,H]", dict(ld=_lg(B, T, H)), ValueError, "ld"),
    ("retention", "ld wrong H", dict(ld=_lg(H + 1)), ValueError, "ld"),
    ("retention", "ld positive", dict(ld=torch.full((H,), 0.2)), ValueError, "ld"),
    ("retention", "ld list", dict(ld=[-0.1] * H), TypeError, "ld"),
    ("retention", "ld int", dict(ld=torch.zeros(H, dtype=I64)), TypeError, "ld"),
    ("retention", "k rank", dict(k=torch.randn(B, T, H)), ValueError, "k"),
    ("retention_step", "ld wrong H", dict(ld=_lg(H + 1)), ValueError, "ld"),
    ("retention_step", "state shape", dict(state=torch.randn(B, H, K)), ValueError, "state"),
    ("retention_step", "scale nan", dict(scale=float("nan")), TypeError, "scale"),
    ("retnet_log_decay", "H zero", dict(H=0), ValueError, "H"),
    ("retnet_log_decay", "H string", dict(H="3"), ValueError, "H"),
    ("retnet_log_decay", "H float", dict(H=3.0), ValueError, "H"),
    # --- mamba2
    ("mamba2", "dt rank 4", dict(dt=torch.rand(B, T, H, 1)), ValueError, "dt"),
    ("mamba2", "A wrong H", dict(A=-torch.rand(H + 1)), ValueError, "A"),
    ("mamba2", "A positive", dict(A=torch.rand(H) + 0.1), ValueError, "A"),
    ("mamba2", "dt negative", dict(dt=-torch.rand(B, T, H) - 0.1), ValueError, "dt"),
    ("mamba2", "dt int", dict(dt=torch.ones(B, T, H, dtype=I64)), TypeError, "dt"),
    ("mamba2", "v rank", dict(v=torch.randn(B, T, H)), ValueError, "v"),
    ("mamba2_step", "dt shape", dict(dt=torch.rand(B, 1)), ValueError, "dt"),
    ("mamba2_step", "A shape", dict(A=-torch.rand(1, H)), ValueError, "A"),
    ("mamba2_step", "state shape", dict(state=torch.randn(B, H, V, K)), ValueError, "state"),
    ("mamba2_step", "scale string", dict(scale="1"), TypeError, "scale"),
    # --- hgrn2
    ("hgrn2", "g wrong K", dict(g=_lg(B, T, H, K - 1)), ValueError, "g"),
    ("hgrn2", "g positive", dict(g=torch.full((B, T, H, K), 1.0)), ValueError, "g"),
    ("hgrn2", "q rank", dict(q=torch.randn(B, T, H * K)), ValueError, "q"),
    ("hgrn2", "v dtype", dict(v=torch.randn(B, T, H, V).half()), TypeError, "v"),
    ("hgrn2_step", "g shape", dict(g=_lg(B, H, K + 1)), ValueError, "g"),
    ("hgrn2_step", "v rank", dict(v=torch.randn(B, V)), ValueError, "v"),
    ("hgrn2_step", "scale string", dict(scale="1"), TypeError, "scale"),
    # --- recurrent_step
    ("recurrent_step", "q rank 4", dict(q=torch.randn(B, 1, H, K)), ValueError, "q"),
    ("recurrent_step", "k shape", dict(k=torch.randn(B, H, K - 1)), ValueError, "k"),
    ("recurrent_step", "ld shape", dict(ld=_lg(B, H, K + 1)), ValueError, "ld"),
    ("recurrent_step", "ld [H] wrong", dict(ld=_lg(H + 1)), ValueError, "ld"),
    ("recurrent_step", "rd shape", dict(rd=_lg(B, H, K)), ValueError, "rd"),
    ("recurrent_step", "state shape", dict(state=torch.randn(B, H, V, K)), ValueError, "state"),
    ("recurrent_step", "v int", dict(v=torch.ones(B, H, V, dtype=I64)), TypeError, "v"),
    ("recurrent_step", "scale string", dict(scale="x"), TypeError, "scale"),
]

# cu_seqlens cases, run for every op that takes cu_seqlens
BAD_CU = [
    ("float", torch.tensor([0.0, 4.0, 10.0]), TypeError),
    ("decreasing", torch.tensor([0, 6, 4, 10]), ValueError),
    ("empty sequence", torch.tensor([0, 4, 4, 10]), ValueError),
    ("not ending at T", torch.tensor([0, 4, 12]), ValueError),
    ("not starting at 0", torch.tensor([2, 4, 10]), ValueError),
    ("2-D", torch.tensor([[0, 4, 10]]), ValueError),
    ("list", [0, 4, 10], TypeError),
]


def _named(msg, arg):
    """The argument's name appears as a word in the message (so "k" is not matched by "kind")."""
    return re.search(r"(?<![A-Za-z_])" + re.escape(arg) + r"(?![A-Za-z_])", msg) is not None


def _call(fn, over, base):
    a = base()
    a.update(over)
    return getattr(ula.ops, fn)(**a)


def test_every_good_call_runs():
    """The baselines are valid, so each case fails only because of its override."""
    for fn, base in list(GOOD.items()) + list(PACKED.items()):
        a = base()
        if fn in PACKED and base is PACKED[fn]:
            a["cu_seqlens"] = torch.tensor([0, 4, 10])
        getattr(ula.ops, fn)(**a)


def test_catalogue_covers_every_public_function():
    assert set(ula.ops.__all__) == set(GOOD), set(ula.ops.__all__) ^ set(GOOD)
    assert set(ula.ops.__all__) <= {c[0] for c in CASES}


@pytest.mark.parametrize("fn,case,over,exc,arg", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_input(fn, case, over, exc, arg):
    with pytest.raises(exc) as e:
        _call(fn, over, GOOD[fn])
    msg = str(e.value)
    assert _named(msg, arg), f"{fn} ({case}): the message does not name {arg!r}: {msg}"
    # not a shape error from deep inside torch: ours name what was wanted
    assert "must" in msg or "needs" in msg, f"{fn} ({case}): unclear message: {msg}"


@pytest.mark.parametrize("cu_case", BAD_CU, ids=[c[0] for c in BAD_CU])
@pytest.mark.parametrize("fn", sorted(PACKED))
def test_bad_cu_seqlens(fn, cu_case):
    _, cu, exc = cu_case
    with pytest.raises(exc) as e:
        _call(fn, dict(cu_seqlens=cu), PACKED[fn])
    assert _named(str(e.value), "cu_seqlens"), str(e.value)


@pytest.mark.parametrize("fn", sorted(PACKED))
def test_cu_seqlens_needs_batch_one(fn):
    with pytest.raises(ValueError, match="B == 1"):
        _call(fn, dict(cu_seqlens=torch.tensor([0, 4, 10])), GOOD[fn])


@pytest.mark.parametrize("fn", ["gla", "mlstm", "gsa", "abc", "linear_attn", "retention", "mamba2", "hgrn2",
                                "normalized_linear_attention"])
def test_state_per_sequence_with_cu_seqlens(fn):
    """With cu_seqlens the states are one per sequence (N), not one per batch row."""
    cu = torch.tensor([0, 4, 10])
    one = {"mlstm": (torch.randn(1, H, K, V), torch.randn(1, H, K), torch.randn(1, H)),
           "gsa": (torch.randn(1, H, K, M), torch.randn(1, H, M, V)),
           "abc": (torch.randn(1, H, K, M), torch.randn(1, H, M, V), torch.randn(1, H, M)),
           "normalized_linear_attention": torch.randn(1, H, K + 1, V + 1)}.get(fn, torch.randn(1, H, K, V))
    with pytest.raises(ValueError) as e:
        _call(fn, dict(cu_seqlens=cu, initial_state=one), PACKED[fn])
    assert "state" in str(e.value), str(e.value)


def test_messages_stay_short_for_tensor_arguments():
    """A tensor passed where a string or number belongs (e.g. a state given positionally into `variant`) is named
    by its shape, not printed element by element."""
    a = GOOD["mlstm"]()
    with pytest.raises(ValueError) as e:
        ula.ops.mlstm(a["q"], a["k"], a["v"], a["i"], a["f"], torch.randn(B, H, K, V))
    assert "variant" in str(e.value) and len(str(e.value)) < 200, str(e.value)


@pytest.mark.parametrize("over, arg", [(dict(output_final_state="no"), "output_final_state"),
                                       (dict(reverse=1), "reverse"), (dict(precision="bogus"), "precision")])
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_core_flags_and_precision_checked_on_every_backend(over, arg, backend):
    a = GOOD["linear_attn"]()
    with pytest.raises((TypeError, ValueError)) as e:
        ula.linear_attention(a["q"], a["k"], a["v"], backend=backend, **over)
    assert _named(str(e.value), arg), str(e.value)


def test_session40_messages():
    """Messages found lacking by session 40's audit of the docs: each says what was given and what to do."""
    import numpy as np
    a = GOOD["linear_attn"]()
    q, k, v = a["q"], a["k"], a["v"]
    with pytest.raises(ValueError, match=r"numpy\.int64: pass a Python int"):
        ula.linear_attention(q, k, v, chunk_size=np.int64(64))
    with pytest.raises(TypeError, match=r"numpy\.float32: pass a Python float"):
        ula.linear_attention(q, k, v, scale=np.float32(0.5))
    with pytest.raises(ValueError, match=r"got 'fastest'"):
        ula.linear_attention(q, k, v, precision="fastest")
    with pytest.raises(RuntimeError, match=r"init_process_group first\), got int"):
        ula.linear_attention(q, k, v, cp_group=1)
    t = GOOD["mlstm_step"]()
    with pytest.raises(TypeError, match=r"pass variant='sig'"):
        ula.mlstm_step(t["q"], t["k"], t["v"], t["i"], t["f"], "sig")
    with pytest.raises(TypeError, match=r"float64 too with float64"):
        ula.linear_attention(q.double(), k.double(), v.double(), initial_state=torch.zeros(B, H, K, V).bfloat16())


def test_reference_checks_its_inputs():
    """ula.reference_linear_attention is public: bad inputs raise as the core's do (they gave silent zeros)."""
    q = torch.randn(2, 12, 1, 4)
    with pytest.raises(ValueError, match="B == 1"):
        ula.reference_linear_attention(q, q, q, cu_seqlens=torch.tensor([0, 5, 12]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        ula.reference_linear_attention(q[:1], q[:1], q[:1], cu_seqlens=torch.tensor([0, 5, 9]))
    with pytest.raises(ValueError, match="ld"):
        ula.reference_linear_attention(q, q, q, torch.ones(1))


@pytest.mark.parametrize("fn", ["linear_attn_step", "gla_step", "mlstm_step", "gsa_step"])
def test_steps_refuse_empty_widths(fn):
    a = GOOD[fn]()
    a["q"], a["k"] = a["q"][..., :0], a["k"][..., :0]
    for name in ("g",):
        if name in a and a[name].shape[-1] == K:
            a[name] = a[name][..., :0]
    with pytest.raises(ValueError, match="K, V >= 1"):
        getattr(ula.ops, fn)(**a)


def test_gsa_refuses_zero_slots():
    a = GOOD["gsa"]()
    a["g"] = a["g"][..., :0]
    with pytest.raises(ValueError, match="m >= 1 slots"):
        ula.ops.gsa(**a)
