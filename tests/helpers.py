"""Shared test helpers: fresh random inputs and comparison against autograd through the float64 reference."""
import os

import torch
import torch.nn.functional as F

from ula.core.reference import reference_linear_attention

KINDS = ("none", "constant", "scalar", "vector")
# where the Triton kernels run: the GPU only when they are compiled for it (ULA_TEST_GPU=1, tests/conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def fresh_seed():
    """A new seed every run (inputs must be fresh), reported in failure messages to replay a case: ULA_TEST_SEED=<seed>
    makes every test draw that seed."""
    seed = int(os.environ.get("ULA_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(seed)
    return seed


def log_decay(shape, device="cpu", dtype=torch.float32, strength=3.0):
    """log of a decay in (0, 1): logsigmoid of N(strength, 1), float32 as the API wants it."""
    return F.logsigmoid(torch.randn(shape, device=device, dtype=torch.float64) + strength).to(dtype)


def make_inputs(kind, right, B, T, H, K, V, *, h0=True, N=None, dtype=torch.float32, device="cpu"):
    """q, k, v, ld, rd, initial_state (N states with varlen)."""
    q = torch.randn(B, T, H, K, dtype=dtype, device=device)
    k = torch.randn(B, T, H, K, dtype=dtype, device=device)
    v = torch.randn(B, T, H, V, dtype=dtype, device=device)
    ddt = torch.float64 if dtype == torch.float64 else torch.float32
    ld = {"none": None, "constant": log_decay((H,), device, ddt, 2.0), "scalar": log_decay((B, T, H), device, ddt),
          "vector": log_decay((B, T, H, K), device, ddt)}[kind]
    rd = log_decay((B, T, H, V), device, ddt) if right else None
    s0 = torch.randn(N or B, H, K, V, dtype=ddt, device=device) if h0 else None
    return q, k, v, ld, rd, s0


def rel(x, ref, floor=1e-30):
    """|x - ref| / max(|ref|, floor) (Frobenius norms)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(x).all(), "non-finite values (an unwritten or overflowed element)"
    return ((x - ref).norm() / ref.norm().clamp_min(floor)).item()


def compare_with_reference(fn, inputs, *, final=True, **kw):
    """Run `fn` (an op with the signature of ula.linear_attention) and the float64 reference on the same
    inputs and the same random output gradients; return {name: relative error} for o, the final state
    and the gradient of every input (a constant decay's: `constant_decay_error`)."""
    names = ("q", "k", "v", "ld", "rd", "initial_state")
    ours = [None if x is None else x.detach().clone().requires_grad_() for x in inputs]
    refs = [None if x is None else x.detach().double().cpu().requires_grad_() for x in inputs]
    o_ref, S_ref = reference_linear_attention(*refs[:5], initial_state=refs[5], output_final_state=final, **kw)
    do = torch.randn_like(o_ref)
    loss_ref = (o_ref * do).sum()
    o, S = fn(*ours[:5], initial_state=ours[5], output_final_state=final, **kw)
    loss = (o.double().cpu() * do).sum()
    if final:
        dS = torch.randn_like(S_ref)
        loss_ref = loss_ref + (S_ref * dS).sum()
        loss = loss + (S.double().cpu() * dS).sum()
    loss_ref.backward()
    loss.backward()
    errs = {"o": rel(o, o_ref)}
    if final:
        errs["final_state"] = rel(S, S_ref)
    for name, a, b in zip(names, ours, refs):
        if a is not None:
            assert a.grad is not None, f"no gradient for {name}"
            errs["d" + name] = rel(a.grad, b.grad)
    if inputs[3] is not None and inputs[3].dim() == 1:
        # the final state's share: T steps of decay, each a term the size of |S_T ⊙ dS| (q = k = 0 leaves only it)
        extra = inputs[0].shape[1] * (S_ref * dS).detach().abs().sum((0, 2, 3)) if final else None
        errs["dld"] = constant_decay_error(ours[3].grad, refs[3].grad, refs[0], refs[0].grad, refs[1], refs[1].grad,
                                           extra)
    return errs


def constant_decay_error(g, g_ref, q, dq, k, dk, extra=None):
    """Error of a constant decay's gradient [H] (float64 reference g_ref, q, dq, k, dk): per head, relative to the
    true value, but to no less than a tenth of Σ |q⊙dq| + |k⊙dk| over B, T, K, the sizes of the terms it sums.
    Those cancel on some draws (true value ~1e-3 of them), where float32 cannot reach 1e-4 relative however it
    sums (tests/test_extreme.py measured 3e-2 relative, 3.7e-6 of the terms, on one draw in ~100); the largest
    over heads. extra [H]: the sizes of further terms (the final state's), added to them."""
    terms = ((q * dq).abs() + (k * dk).abs()).sum((0, 1, 3)).detach().double().cpu()
    if extra is not None:
        terms = terms + extra.detach().double().cpu()
    g_ref = g_ref.detach().double().cpu()
    assert torch.isfinite(g).all(), "non-finite values (an unwritten or overflowed element)"
    scale = torch.maximum(g_ref.abs(), 0.1 * terms).clamp_min(1e-30)
    return ((g.detach().double().cpu() - g_ref).abs() / scale).max().item()


# mixer sizes small enough for CPU tests of layers and models
SMALL_MIXER_KWARGS = {"gsa": dict(num_slots=8), "mamba2": dict(d_state=8)}


def emulated_bf16_errors(*args, **env):
    """benchmarks/cpu_bf16_error.py run with `args` under the interpreter with emulated bf16 matmuls
    (ULA_EMULATE_BF16=1) and `env` added: its last line as {tensor name: relative error against float64}."""
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "cpu_bf16_error.py")
    env = dict(os.environ, ULA_EMULATE_BF16="1", TRITON_INTERPRET="1", **env)
    out = subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    words = out.stdout.strip().splitlines()[-1].split(": ")[-1].split()
    return dict(zip(words[::2], map(float, words[1::2])))


def record_launches(monkeypatch, what):
    """Spy on the Triton launches that go through utils.launch (utils._launch_fitting): for each, what(kernel,
    warps, constexprs, stages) is appended to the returned list unless it is None; the launch itself runs as
    before."""
    from ula.core.triton import utils
    seen, real = [], utils._launch_fitting

    def spy(kernel, grid, args, w, cx, s=None):
        item = what(kernel, w, cx, s)
        if item is not None:
            seen.append(item)
        return real(kernel, grid, args, w, cx, s)

    monkeypatch.setattr(utils, "_launch_fitting", spy)
    monkeypatch.setattr(utils, "_LAUNCHES", {})  # compiled: a cached launch would skip _launch_fitting
    return seen
