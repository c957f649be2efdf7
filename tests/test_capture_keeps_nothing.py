"""What is kept for later calls is not made during a CUDA graph capture (ula/core/capture.py): then kernels are
recorded, not run, and a kept tensor would hold values only after a replay (on an H200 an eager packed call after
such a capture returned NaN: tests/test_gpu_graph_layouts.py). Here the capture is simulated on the CPU: the layouts
of cu_cache, RetNet's fixed decays and the softmax layer's RoPE frequencies are made but not kept while it lasts,
and kept otherwise; cu_seqlens' host values (no kernel) are kept either way."""
import pytest
import torch

from ula.layers import MIXERS
from ula.ops import retnet_log_decay
from ula.core import capture, cu_cache
from ula.ops._common import PackedTokens


@pytest.fixture(params=[False, True], ids=["eager", "capturing"])
def capturing(request, monkeypatch):
    monkeypatch.setattr(capture, "capturing", lambda: request.param)
    return request.param


def test_cu_cache(capturing):
    cu = torch.tensor([0, 5, 12])
    first = PackedTokens.of(cu, 12, cu.device)
    assert (PackedTokens.of(cu, 12, cu.device) is first) != capturing
    assert first.seq.tolist() == [0] * 5 + [1] * 7
    assert cu_cache.host_values(cu) is cu_cache.host_values(cu)


def test_retnet_decays(capturing):
    layer = MIXERS["retnet"](32, 2)
    x = torch.randn(1, 5, 32)
    layer(x)
    assert hasattr(layer, "_ld_cache") != capturing
    assert torch.equal(layer._ld(x), retnet_log_decay(2, x.device))


def test_softmax_rope_frequencies(capturing):
    layer = MIXERS["softmax"](32, 2)
    inv = layer._rope_inv(torch.device("cpu"))
    assert hasattr(layer, "_rope_inv_cache") != capturing
    assert torch.allclose(inv, 1.0 / 10000.0 ** (torch.arange(0, 16, 2) / 16))
