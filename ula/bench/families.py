"""Inputs and calls of every public op, ours and the peers' on the same inputs, for benchmarks/gpu_*.py.

    x = make(op, B, T, H, K, V, device, dtype)   # dict of leaf tensors (requires_grad where differentiable)
    o = ours(op)(x)                               # ula, [B, T, H, V]
    o = fla(op)(x)                                # the same computation in fla (ImportError when missing)
    fn, args = as_args(ours(op), x)               # the (fn, args) form of ula.bench.measure

Inputs: q, k ~ N(0, 1/K), v ~ N(0, 1); log decays logsigmoid(N(4, 1)) in float32 (RetNet's per-head decays
for the constant kind); mLSTM gate pre-activations i ~ N(-2, 1), f ~ N(4, 1); GSA write strengths s ~ N(0, 1)
and slot forget gates as the log decays, m slots. "normalized_pos" has positive q, k and a = 0, b = 1
without L2 norm: o_t = Σ (q_t·k_n) v_n / Σ q_t·k_n, what fla's chunk_linear_attn(normalize=True) computes;
"normalized_nol2" is "normalized" (a = b = 1) without the L2 norm of q and k (paper 001's Eq. 22 is optional);
"linear_l2" is plain linear attention on the same L2-normalized q, k as "normalized", the norm by F.normalize, as a
user would write it: "normalized" minus its normalizer; "linear_l2_fused" the same with the norm by ula's own L2
kernels (ula/ops/_l2norm.py; F.normalize off CUDA). "abc_fla_form" is ABC as fla's chunk_abc computes it, every
earlier write rescaled by the current normalizer (not paper 004's Eq. 3-4 as printed, which ula.abc follows): ours
as ula.gsa with s = φ and g = z_{t−1} − z_t = log(1 − φ_t), z the running log-normalizer of the slot logits w,
both from ula's cumulative softmax (benchmarks/cpu_abc_forms.py checks the equivalence).
TFLA (mlstm-kernels) takes [B, H, T, D]: `make_tfla` builds its inputs in that layout, so no transpose is
timed."""
import torch
import torch.nn.functional as F

import ula
from ula.ops.normalized import _normed  # the L2 norm normalized attention applies (its kernels, or F.normalize)

CORE_KINDS = ("none", "constant", "scalar", "vector")
FAMILIES = ("gla", "mlstm_sig", "mlstm_exp", "gsa", "normalized", "linear")
CONVENIENCES = ("linear_attn", "retention", "mamba2", "hgrn2", "abc")
FLA_SHARED = ("none", "constant", "scalar", "gla", "gsa", "normalized_pos", "abc_fla_form")


def _logsig(*shape, device):
    return F.logsigmoid(torch.randn(*shape, device=device, dtype=torch.float32) + 4)


def make(op, B, T, H, K, V, device, dtype, m=64, initial_state=False, seed=0):
    """The leaf inputs of `op` (see the module docstring); initial_state adds h0 [B, H, K, V] (core kinds)."""
    torch.manual_seed(seed)
    dev = device

    def r(*s, sc=1.0, dt=dtype):
        return torch.randn(*s, device=dev, dtype=dt) * sc

    if op == "normalized_pos":
        x = dict(q=torch.rand(B, T, H, K, device=dev, dtype=dtype) * K ** -0.5,
                 k=torch.rand(B, T, H, K, device=dev, dtype=dtype) * K ** -0.5, v=r(B, T, H, V))
    elif op == "hgrn2":
        x = dict(q=r(B, T, H, K, sc=K ** -0.5), v=r(B, T, H, V), g=_logsig(B, T, H, K, device=dev))
    else:
        x = dict(q=r(B, T, H, K, sc=K ** -0.5), k=r(B, T, H, K, sc=K ** -0.5), v=r(B, T, H, V))
    if op == "constant":
        x["ld"] = ula.retnet_log_decay(H, dev)
    elif op == "scalar":
        x["ld"] = _logsig(B, T, H, device=dev)
    elif op in ("vector", "gla"):
        x["ld" if op == "vector" else "g"] = _logsig(B, T, H, K, device=dev)
    elif op in ("mlstm_sig", "mlstm_exp"):
        x["i"], x["f"] = r(B, T, H) - 2, r(B, T, H) + 4
    elif op == "gsa":
        x["s"], x["g"] = r(B, T, H, m), _logsig(B, T, H, m, device=dev)
    elif op in ("abc", "abc_fla_form"):
        x["w"] = r(B, T, H, m)
    elif op == "mamba2":
        x["dt"] = F.softplus(r(B, T, H, dt=torch.float32) - 1)
        x["A"] = -torch.exp(r(H, dt=torch.float32))
    if initial_state and op in CORE_KINDS:
        x["h0"] = r(B, H, K, V, sc=0.1, dt=torch.float32)
    return {n: t.contiguous().requires_grad_() for n, t in x.items()}


def ours(op, chunk_size=None, backend="auto"):
    """fn(x) -> o of ula's op on the inputs of `make(op, ...)`."""
    kw = dict(backend=backend)
    if chunk_size is not None:
        kw["chunk_size"] = chunk_size
    if op in CORE_KINDS:
        return lambda x: ula.linear_attention(x["q"], x["k"], x["v"], x.get("ld"), initial_state=x.get("h0"),
                                              **kw)[0]
    calls = {
        "linear": lambda x: ula.linear_attention(x["q"], x["k"], x["v"], **kw)[0],
        "linear_l2": lambda x: ula.linear_attention(*_normed(x["q"], x["k"], False), x["v"], **kw)[0],
        "linear_l2_fused": lambda x: ula.linear_attention(*_normed(x["q"], x["k"], x["q"].is_cuda), x["v"], **kw)[0],
        "gla": lambda x: ula.gla(x["q"], x["k"], x["v"], x["g"], **kw)[0],
        "mlstm_sig": lambda x: ula.mlstm(x["q"], x["k"], x["v"], x["i"], x["f"], "sig", **kw)[0],
        "mlstm_exp": lambda x: ula.mlstm(x["q"], x["k"], x["v"], x["i"], x["f"], "exp", **kw)[0],
        "gsa": lambda x: ula.gsa(x["q"], x["k"], x["v"], x["s"], x["g"], **kw)[0],
        "normalized": lambda x: ula.normalized_linear_attention(x["q"], x["k"], x["v"], **kw)[0],
        "normalized_nol2": lambda x: ula.normalized_linear_attention(x["q"], x["k"], x["v"], qk_l2_norm=False,
                                                                     **kw)[0],
        "normalized_pos": lambda x: ula.normalized_linear_attention(x["q"], x["k"], x["v"], 0.0, 1.0,
                                                                    qk_l2_norm=False, eps=1e-10, **kw)[0],
        "linear_attn": lambda x: ula.linear_attn(x["q"], x["k"], x["v"], **kw)[0],
        "retention": lambda x: ula.retention(x["q"], x["k"], x["v"], **kw)[0],
        "mamba2": lambda x: ula.mamba2(x["q"], x["k"], x["v"], x["dt"], x["A"], **kw)[0],
        "hgrn2": lambda x: ula.hgrn2(x["q"], x["v"], x["g"], **kw)[0],
        "abc": lambda x: ula.abc(x["q"], x["k"], x["v"], x["w"], **kw)[0],
        "abc_fla_form": lambda x: ula.gsa(x["q"], x["k"], x["v"], *_fla_abc_gates(x["w"], backend), **kw)[0],
    }
    if op not in calls:
        raise ValueError(f"unknown op {op!r}; choose from {CORE_KINDS + tuple(calls)}")
    return calls[op]


def _fla_abc_gates(w, backend="auto"):
    """(s, g) of fla's ABC form from slot logits w: s = φ = exp(w − z), z the running log-normalizer of w along
    time, and g = z_{t−1} − z_t = log(1 − φ_t) (z_t = logaddexp(z_{t−1}, w_t)), so both come from ula's cumulative
    softmax (its kernels on the Triton backend). φ is capped just below 1 (where the last logit dominates, or at the
    first step: the state it decays is then nil or below float rounding), which keeps g and its gradient finite."""
    from ula.ops.gsa import _cumulative_softmax
    phi, _ = _cumulative_softmax(w, None, None, backend)
    g = torch.log1p(-phi.clamp_max(1.0 - torch.finfo(phi.dtype).eps / 2))
    return phi.to(w.dtype), g


def fla(op):
    """fn(x) -> o of fla's kernel computing what ours(op) computes (the constant decay is not learnable in
    fla: its g_gamma gets no gradient). Raises ImportError when fla is missing."""
    if op in ("none", "linear", "normalized_pos"):
        from fla.ops.linear_attn import chunk_linear_attn
        norm = op == "normalized_pos"
        return lambda x: chunk_linear_attn(x["q"], x["k"], x["v"], normalize=norm,
                                           initial_state=x.get("h0"))[0]
    if op in ("constant", "scalar"):
        from fla.ops.simple_gla import chunk_simple_gla
        if op == "constant":
            return lambda x: chunk_simple_gla(x["q"], x["k"], x["v"], g_gamma=x["ld"].detach(),
                                              initial_state=x.get("h0"))[0]
        return lambda x: chunk_simple_gla(x["q"], x["k"], x["v"], g=x["ld"], initial_state=x.get("h0"))[0]
    if op in ("vector", "gla"):
        from fla.ops.gla import chunk_gla
        key = "ld" if op == "vector" else "g"
        return lambda x: chunk_gla(x["q"], x["k"], x["v"], x[key], initial_state=x.get("h0"))[0]
    if op == "gsa":
        from fla.ops.gsa import chunk_gsa
        return lambda x: chunk_gsa(x["q"], x["k"], x["v"], x["s"], x["g"])[0]
    if op == "abc_fla_form":
        from fla.ops.abc import chunk_abc
        return lambda x: chunk_abc(x["q"], x["k"], x["v"], x["w"])[0]
    raise ValueError(f"fla has no op for {op!r}; shared ops: {FLA_SHARED}")


def make_tfla(B, T, H, K, V, device, dtype, seed=0):
    """mlstm-kernels inputs in its [B, H, T, D] layout, as in the peers' yardstick script."""
    torch.manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=device, dtype=dtype).requires_grad_()  # noqa: E731
    x = dict(q=r(B, H, T, K), k=r(B, H, T, K), v=r(B, H, T, V))
    x["i"] = (torch.randn(B, H, T, device=device, dtype=dtype) - 2).requires_grad_()
    x["f"] = (torch.randn(B, H, T, device=device, dtype=dtype) + 4).requires_grad_()
    return x


def tfla(variant, chunk_size=128, normalize=True, dtype=torch.bfloat16):
    """fn(x) -> h of the TFLA chunkwise Triton kernel (mlstm-kernels): variant "sig" (normalize as given) or
    "exp" (always normalized)."""
    from mlstm_kernels.torch import get_mlstm_kernel
    if variant == "sig":
        kern = get_mlstm_kernel("chunkwise--triton_xl_chunk_siging")
        return lambda x: kern(x["q"], x["k"], x["v"], x["i"], x["f"], chunk_size=chunk_size, normalize=normalize,
                              autocast_kernel_dtype=dtype)
    kern = get_mlstm_kernel("chunkwise--triton_xl_chunk")
    return lambda x: kern(x["q"], x["k"], x["v"], x["i"], x["f"], chunk_size=chunk_size, autocast_kernel_dtype=dtype)


def as_args(f, x):
    """(fn(*args), args) for ula.bench.measure from fn(x) and the dict x."""
    keys = list(x)
    return (lambda *a: f(dict(zip(keys, a)))), [x[n] for n in keys]


def state_numbers(op, K, V, m=64):
    """Numbers in one head's recurrent state (GSA: K̃ [K, m] and Ṽ [m, V])."""
    if op == "gsa":
        return K * m + m * V
    if op.startswith("normalized"):
        return (K + 1) * (V + 1)
    if op == "mlstm_exp":
        return K * V + K + 1
    return K * V
