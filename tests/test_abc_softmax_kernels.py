"""ABC's cumulative softmax on its Triton kernels (ula/ops/_abc_softmax_kernels.py, the interpreter here) against a
float64 reference written from the definition, step by step: φ_t = exp(w_t) / (exp(z0) + Σ_{j<=t} exp(w_j)) per
sequence, z_T = log of that sum at the last step; outputs and gradients (of w and z0, through φ and z_T). A GPU
file too (conftest.GPU_FILES): with ULA_TEST_GPU=1 the tensors are on the GPU, the kernels compiled for it."""
import pytest
import torch

from helpers import DEVICE, fresh_seed, rel
from ula.ops._abc_softmax_op import cumulative_softmax


def _reference(w, z0, cu):
    """Per sequence, a loop over steps in float64 (logaddexp keeps ±1e4 logits finite)."""
    w = w.double()
    bounds = [(b * w.shape[1], (b + 1) * w.shape[1]) for b in range(w.shape[0])] if cu is None else \
        list(zip(cu[:-1].tolist(), cu[1:].tolist()))
    flat = w.reshape(-1, *w.shape[2:])
    phis, zTs = [], []
    for n, (a, b) in enumerate(bounds):
        z = None if z0 is None else z0[n].double()
        for t in range(a, b):
            z = flat[t] if z is None else torch.logaddexp(z, flat[t])
            phis.append((flat[t] - z).exp())
        zTs.append(z)
    return torch.stack(phis).reshape(w.shape), torch.stack(zTs)


def _both(fn, w, z0, gphi, gz):
    leaves = [w] + ([z0] if z0 is not None else [])
    phi, zT = fn(w, z0)
    return [phi, zT] + list(torch.autograd.grad((phi * gphi).sum() + (zT * gz).sum(), leaves))


@pytest.mark.parametrize("case", ["rows", "rows_z0", "packed", "packed_z0", "packed_empty_z0", "logits_1e4",
                                  "wide_spread", "wide_spread_z0"])
def test_cumulative_softmax_against_float64(case):
    """Odd lengths that cross the interpreter's blocks of 8 steps and 4 slots (m = 6: a partial slot block) and its
    pieces of 4 blocks (a block reads its sequence's earlier and later blocks 4 at a time: 6 blocks here), 2 rows
    or 3 packed sequences (one empty: the kernels keep z0 there, though ula's ops take no empty sequence), with
    and without the initial log-normalizer; logits of ±1e4 (φ 0, 1 or between: the
    pairs keep w − z exact where a float32 z would blur it by 1e-3) and of spread 200 between steps, with z0 too
    (then exp(z0 − z_first) is often tiny: dz0's factor is taken as σ(z0 − w_first), not as 1 − φ_first)."""
    seed = fresh_seed()
    packed = case.startswith("packed")
    cu = torch.tensor([0, 13, 14, 61], dtype=torch.int32) if packed else None
    if case == "packed_empty_z0":
        cu = torch.tensor([0, 13, 13, 61], dtype=torch.int32)
    B, T, H, M = (1, 61, 2, 6) if packed else (2, 45, 2, 6)
    N = 3 if packed else B
    if case == "logits_1e4":
        w = torch.randint(-1, 2, (B, T, H, M)).float() * 1e4
    elif case.startswith("wide_spread"):
        w = torch.randn(B, T, H, M) * 100
        w[:, 0] = w[:, 0].abs()  # with z0 below (about −30): exp(z0 − z_first) < e^-25, dz0 tiny everywhere
    else:
        w = torch.randn(B, T, H, M) * 3
    w.requires_grad_()
    z0 = None
    if case.endswith("z0"):
        z0 = (torch.randn(N, H, M) - (30 if case.startswith("wide") else 0)).requires_grad_()
    gphi, gz = torch.randn(B, T, H, M), torch.randn(N, H, M)
    on = [None if x is None else x.detach().to(DEVICE).requires_grad_(x.requires_grad) for x in (w, z0)]
    got = _both(lambda w, z0: cumulative_softmax(w, z0, None if cu is None else cu.to(DEVICE)), *on,
                gphi.to(DEVICE), gz.to(DEVICE))
    ref = _both(lambda w, z0: _reference(w, z0, cu), w, z0, gphi, gz)
    for name, a, b in zip(["phi", "zT", "dw", "dz0"], got, ref):
        assert rel(a, b) < 1e-5, (name, rel(a, b), seed)


def test_only_the_final_state_used():
    """A gradient through z_T alone (dφ None inside the Function): dw is dz_T's softmax weights at the last step."""
    seed = fresh_seed()
    w = (torch.randn(2, 19, 2, 6) * 3).requires_grad_()
    gz = torch.randn(2, 2, 6)
    wd = w.detach().to(DEVICE).requires_grad_()
    (dw,) = torch.autograd.grad((cumulative_softmax(wd, None, None)[1] * gz.to(DEVICE)).sum(), wd)
    (ref,) = torch.autograd.grad((_reference(w, None, None)[1] * gz).sum(), w)
    assert rel(dw, ref) < 1e-5, seed


def test_half_and_strided_logits():
    """Logits in float16 and as a strided view (the op takes a contiguous copy): φ and z_T float32, dw in w's dtype,
    each within half precision's rounding of the float64 reference on the same (rounded) logits."""
    seed = fresh_seed()
    base = (torch.randn(2, 6, 2, 23) * 3).half()
    w = base.transpose(1, 3).detach().to(DEVICE).requires_grad_()  # [2, 23, 2, 6], not contiguous
    gphi, gz = torch.randn(w.shape).to(DEVICE), torch.randn(2, 2, 6).to(DEVICE)
    phi, zT = cumulative_softmax(w, None, None)
    assert phi.dtype == zT.dtype == torch.float32 and not w.is_contiguous()
    (dw,) = torch.autograd.grad((phi * gphi).sum() + (zT * gz).sum(), w)
    assert dw.dtype == torch.float16
    wr = w.detach().cpu().double().requires_grad_()
    rphi, rzT = _reference(wr, None, None)
    (rdw,) = torch.autograd.grad((rphi * gphi.cpu()).sum() + (rzT * gz.cpu()).sum(), wr)
    assert rel(phi, rphi) < 1e-5 and rel(zT, rzT) < 1e-5, seed
    assert rel(dw, rdw) < 2e-3, (rel(dw, rdw), seed)
