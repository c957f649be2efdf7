"""backend="reference" in every family: the core's calls take the float64 step-by-step recurrence (never the Triton
kernels, also where TRITON_INTERPRET=1 would let them run on the CPU), and the results are the PyTorch path's. Float32
inputs: float64 ones never take the families' fused Triton paths."""
import os

import pytest
import torch

import ula
import ula.core.api as api

B, T, H, K, V = 1, 11, 2, 8, 8


def _inputs():
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32)  # noqa: E731
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    gates = dict(i=r(B, T, H), f=r(B, T, H) + 2, g=torch.nn.functional.logsigmoid(r(B, T, H, K)),
                 s=r(B, T, H, 4), dt=torch.nn.functional.softplus(r(B, T, H)), A=-torch.rand(H))
    return q, k, v, gates


CALLS = {
    "normalized": lambda q, k, v, x, be: ula.normalized_linear_attention(q, k, v, 1.0, 0.5, backend=be),
    "mlstm_exp": lambda q, k, v, x, be: ula.mlstm(q, k, v, x["i"], x["f"], variant="exp", backend=be),
    "mlstm_sig": lambda q, k, v, x, be: ula.mlstm(q, k, v, x["i"], x["f"], variant="sig", backend=be),
    "gla": lambda q, k, v, x, be: ula.gla(q, k, v, x["g"], backend=be),
    "gsa": lambda q, k, v, x, be: ula.gsa(q, k, v, x["s"], x["g"][..., :4], backend=be),
    "retention": lambda q, k, v, x, be: ula.retention(q, k, v, backend=be),
    "mamba2": lambda q, k, v, x, be: ula.mamba2(q, k, v, x["dt"], x["A"], backend=be),
    "hgrn2": lambda q, k, v, x, be: ula.hgrn2(q, v, x["g"], backend=be),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_reference_backend_takes_the_recurrence(name, monkeypatch):
    calls = []
    real = api.recurrence

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(api, "recurrence", counted)
    q, k, v, x = _inputs()
    for t in (q, k, v):
        t.requires_grad_(True)
    o_ref = CALLS[name](q, k, v, x, "reference")[0]
    assert calls, f"{name}: backend='reference' never reached the reference recurrence"
    g_ref = torch.autograd.grad(o_ref.square().sum(), (q, k, v), allow_unused=True)
    o = CALLS[name](q, k, v, x, "torch")[0]
    g = torch.autograd.grad(o.square().sum(), (q, k, v), allow_unused=True)
    torch.testing.assert_close(o_ref, o, rtol=2e-5, atol=2e-5)
    for a, b in zip(g_ref, g):  # None for hgrn2's k (it has none)
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("dtype,want", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                        (torch.bfloat16, torch.float32)])
def test_final_state_dtype_is_the_same_on_every_backend(dtype, want):
    """float32 states (float64 for float64 inputs) from every backend: a float64 gradcheck of the final state needs
    the reference to keep float64 too."""
    backends = ["torch", "reference"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])
    q, k, v, _ = _inputs()
    for be in backends:
        S = ula.linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), output_final_state=True, backend=be)[1]
        assert S.dtype == want, (be, S.dtype)
