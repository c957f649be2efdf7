"""On a GPU (ULA_TEST_GPU=1), a warm training call waits for the GPU nowhere: forward and backward of every family,
unpacked and packed (cu_seqlens read once per tensor, ula/core/cu_cache.py), run with torch.cuda's sync debug mode
set to raise on any synchronizing operation (.item(), .tolist(), nonzero, sizes read from the device)."""
import pytest
import torch
import torch.nn.functional as F

from helpers import DEVICE
import ula

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="host waits exist only with CUDA (ULA_TEST_GPU=1)")

B, T, H, K = 1, 300, 2, 32


def _call(op, cu):
    g = torch.Generator(device=DEVICE).manual_seed(0)

    def r(*s, dt=torch.bfloat16):
        return torch.randn(*s, device=DEVICE, generator=g).to(dt).requires_grad_()

    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, K)
    f32 = torch.float32
    kw = dict(cu_seqlens=cu)
    if op == "linear":
        return ula.linear_attention(q, k, v, **kw)[0]
    if op == "scalar":
        return ula.linear_attention(q, k, v, F.logsigmoid(r(B, T, H, dt=f32) + 3), **kw)[0]
    if op == "gla":
        return ula.gla(q, k, v, F.logsigmoid(r(B, T, H, K, dt=f32) + 3), **kw)[0]
    if op in ("mlstm_exp", "mlstm_sig"):
        return ula.mlstm(q, k, v, r(B, T, H, dt=f32), r(B, T, H, dt=f32) + 3, variant=op[6:], **kw)[0]
    if op == "normalized":
        return ula.normalized_linear_attention(q, k, v, **kw)[0]
    if op == "gsa":
        return ula.gsa(q, k, v, r(B, T, H, 16, dt=f32), F.logsigmoid(r(B, T, H, 16, dt=f32) + 3), **kw)[0]
    if op == "abc":  # (its cumulative softmax on its own kernels, cu_seqlens read on the device)
        return ula.abc(q, k, v, r(B, T, H, 16, dt=f32), **kw)[0]
    if op == "retention":
        return ula.retention(q, k, v, **kw)[0]
    raise ValueError(op)


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("op", ["linear", "scalar", "gla", "mlstm_exp", "mlstm_sig", "normalized", "gsa", "abc",
                                "retention"])
def test_warm_call_does_not_wait(op, packed):
    cu = torch.tensor([0, 77, 200, T], device=DEVICE, dtype=torch.int32) if packed else None
    _call(op, cu).float().sum().backward()  # the first call: compiles, reads cu_seqlens once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _call(op, cu).float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("mixer", ["gla", "gsa", "mlstm_exp", "mlstm_sig", "linear", "retnet", "mamba2", "hgrn2",
                                   "normalized", "softmax"])
def test_warm_lm_training_step_does_not_wait(mixer, packed):
    """A small language model's forward, loss and backward with each mixer: the layers around the ops (projections,
    gates, norms, the softmax baseline's packed attention) wait for the GPU nowhere either."""
    from ula.models import CausalLM, LMConfig
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=2, mixer=mixer)).to(DEVICE)
    ids = torch.randint(0, 64, (1, 200), device=DEVICE)
    cu = torch.tensor([0, 77, 200], device=DEVICE, dtype=torch.int32) if packed else None

    def step():
        logits, _ = model(ids, cu_seqlens=cu)
        F.cross_entropy(logits[0, :-1].float(), ids[0, 1:]).backward()

    step()  # the first call: compiles, reads cu_seqlens once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
