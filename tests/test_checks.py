"""Every bad input raises a clear error naming the argument, what it got and what it needs."""
import pytest
import torch

import ula

B, T, H, K, V = 2, 10, 3, 8, 6


def ok():
    return dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, H, V))


def call(**over):
    a = ok()
    a.update(over)
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    return ula.linear_attention(q, k, v, **a)


CASES = [
    ("q rank", dict(q=torch.randn(B, T, H * K)), ValueError, "q must have 4 dims"),
    ("q not tensor", dict(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    ("q int dtype", dict(q=torch.ones(B, T, H, K, dtype=torch.int64)), TypeError, "q must be float16"),
    ("k shape", dict(k=torch.randn(B, T, H, K + 1)), ValueError, "k must have the shape of q"),
    ("v shape", dict(v=torch.randn(B, T + 1, H, V)), ValueError, "v must be [B, T, H, V]"),
    ("k dtype", dict(k=torch.randn(B, T, H, K, dtype=torch.float64)), TypeError, "k must have the dtype of q"),
    ("v dtype", dict(v=torch.randn(B, T, H, V).half()), TypeError, "v must have the dtype of q"),
    ("ld shape", dict(ld=-torch.rand(B, T)), ValueError, "ld must be None, [H]"),
    ("ld vector wrong K", dict(ld=-torch.rand(B, T, H, K + 1)), ValueError, "ld must be"),
    ("ld dtype", dict(ld=-torch.rand(H).bfloat16()), TypeError, "ld (log decay) must be float32"),
    ("ld positive", dict(ld=torch.full((H,), 0.5)), ValueError, "ld is a log decay and must be finite and <= 0"),
    ("ld nan", dict(ld=torch.tensor([-1.0, float("nan"), -1.0])), ValueError, "ld is a log decay"),
    ("ld -inf", dict(ld=torch.full((B, T, H), float("-inf"))), ValueError, "ld is a log decay"),
    ("rd shape", dict(rd=-torch.rand(B, T, H, K + 5)), ValueError, "rd must be None or [B, T, H, V]"),
    ("rd inf", dict(rd=torch.full((B, T, H, V), float("inf"))), ValueError, "rd is a log decay"),
    ("scale", dict(scale="big"), TypeError, "scale must be a finite number"),
    ("scale nan", dict(scale=float("nan")), TypeError, "scale must be a finite number"),
    ("state shape", dict(initial_state=torch.randn(B, H, V, K)), ValueError, "initial_state must be [B, H, K, V]"),
    ("state dtype", dict(initial_state=torch.randn(B, H, K, V).half()), TypeError, "initial_state must be float32"),
    ("chunk size", dict(chunk_size=48), ValueError, "or a power of two from 16 to 1024"),
    ("chunk size small", dict(chunk_size=8), ValueError, "or a power of two from 16 to 1024"),
    ("backend", dict(backend="cuda"), ValueError, "backend must be one of"),
]


@pytest.mark.parametrize("name,over,exc,msg", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, over, exc, msg):
    with pytest.raises(exc) as e:
        call(**over)
    assert msg in str(e.value), str(e.value)


def _packed(cu, **over):
    a = dict(q=torch.randn(1, T, H, K), k=torch.randn(1, T, H, K), v=torch.randn(1, T, H, V), cu_seqlens=cu)
    a.update(over)
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    return ula.linear_attention(q, k, v, **a)


VARLEN = [
    ("float", torch.tensor([0.0, 4.0, 10.0]), {}, TypeError, "cu_seqlens must be an int32 or int64"),
    ("not increasing", torch.tensor([0, 6, 4, 10]), {}, ValueError, "strictly increasing"),
    ("empty sequence", torch.tensor([0, 4, 4, 10]), {}, ValueError, "strictly increasing"),
    ("not ending at T", torch.tensor([0, 4, 9]), {}, ValueError, "end at T = 10"),
    ("not starting at 0", torch.tensor([1, 4, 10]), {}, ValueError, "start at 0"),
    ("2-D", torch.tensor([[0, 4, 10]]), {}, ValueError, "cu_seqlens must be 1-D"),
    ("state per sequence", torch.tensor([0, 4, 10]), dict(initial_state=torch.randn(1, H, K, V)), ValueError,
     "initial_state must be [N, H, K, V]"),
]


@pytest.mark.parametrize("name,cu,over,exc,msg", VARLEN, ids=[c[0] for c in VARLEN])
def test_bad_varlen(name, cu, over, exc, msg):
    with pytest.raises(exc) as e:
        _packed(cu, **over)
    assert msg in str(e.value), str(e.value)


def test_varlen_needs_batch_one():
    with pytest.raises(ValueError, match="B == 1"):
        call(cu_seqlens=torch.tensor([0, 4, 10]))


def test_error_names_what_it_got():
    with pytest.raises(ValueError) as e:
        call(k=torch.randn(B, T, H, K + 1))
    assert str((B, T, H, K + 1)) in str(e.value)


def test_device_mismatch():
    with pytest.raises(ValueError, match="k must be on the device of q"):
        call(k=torch.randn(B, T, H, K, device="meta"))
    with pytest.raises(ValueError, match="ld must be on the device of q"):
        call(ld=torch.zeros(H, device="meta"))


def test_value_check_policy():
    """Values are checked on the CPU always; elsewhere (a GPU, here the meta device) only when asked, since
    reading them waits for the device; never while compiling."""
    from ula.core.checks import check_values
    cpu, meta = torch.zeros(2), torch.zeros(2, device="meta")
    assert check_values(cpu) and not check_values(meta)
    try:
        ula.set_value_checks(True)
        assert check_values(meta)
    finally:
        ula.set_value_checks(False)
    assert not check_values(meta)
