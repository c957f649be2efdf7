"""Gated Slot Attention (paper 004, Eq. 6-7) and ABC (Eq. 3-4): m memory slots read through a softmax.

GSA, per slot j with forget gate α_t in (0, 1)^m:
    K̃_t = Diag(α_t) K̃_{t-1} + s_t ⊗ k_t,    Ṽ_t = Diag(α_t) Ṽ_{t-1} + s_t ⊗ v_t     (K̃, Ṽ in R^{m×d})
    o_t = Ṽ_tᵀ softmax(scale · K̃_t q_t)
with write strengths s_t = 1 − α_t in the paper (Eq. 6). As two core calls (Eq. 7), state S = K̃ᵀ / Ṽ:
    pass 1: o'_t = linear_attention(q, k, s, ld=None, rd=log α)     (S1 = K̃ᵀ [K, m]; right decay)
    pass 2: o_t  = linear_attention(softmax(o'), s, v, ld=log α, rd=None, scale=1)   (S2 = Ṽ [m, V])
The right decay is what makes pass 1 a plain call.

Arguments: g = log α [B, T, H, m] (<= 0) and s [B, T, H, m] the write strengths. Either may be left out:
  * s None  -> s = 1 − exp(g) (computed as −expm1(g)), the paper's GSA; gradients reach g through both.
  * g None  -> no forgetting: ABC (Eq. 3) with s = φ the write strengths. `abc` takes the slot logits
    W_φ x instead and forms the paper's cumulative softmax φ_t = exp(w_t) / Σ_{j<=t} exp(w_j) (Eq. 4).
`scale` (default K ** -0.5) multiplies K̃_t q_t before the softmax; scale=1 is Eq. 6 as printed."""
import torch

from ..core import linear_attention
from ..core.api import _pad_to_16, one_sequence_as_batch
from ..core.backends import chunk_fn, runs_triton
from ..core.op import o_for_grad, run
from ..core.precision import call_code, parse
from ..core.time_scan import scan_time
from ._checks import (check_float, check_sequence, check_state_tuple, check_step_qkv, num_sequences)
from ._common import PackedTokens, _step, decay_dtype, last_step, per_step


def _check_gsa(op, q, v, s, g, state, N, dim, step, n_state=2, s_name="s"):
    """s, g [B, (T,) H, m]; state (K̃ᵀ [N, H, K, m], Ṽ [N, H, m, V] (, log Σ exp w [N, H, m]))."""
    if s is None and g is None:
        if s_name != "s":
            raise TypeError(f"{op}: {s_name} (slot logits) must be a [B, (T,) H, m] tensor, got None")
        raise ValueError(f"{op} needs the log forget gate g, the write strengths s, or both")
    lead = tuple(q.shape[:-1])
    what = "[B, H, m]" if step else "[B, T, H, m]"
    name, ref = (s_name, s) if s is not None else ("g", g)
    if not isinstance(ref, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a {what} floating-point torch.Tensor, got {type(ref).__name__}")
    if ref.dim() != len(lead) + 1 or tuple(ref.shape[:-1]) != lead:
        raise ValueError(f"{op}: {name} must be {what} (m slots) with {what[1:-4]} = {lead} as in q, "
                         f"got shape {tuple(ref.shape)}")
    m = ref.shape[-1]
    if m == 0:
        raise ValueError(f"{op}: {name} must be {what} with m >= 1 slots, got shape {tuple(ref.shape)}")
    if s is not None:  # ABC's logits finite: a -inf at a sequence's first step has no softmax (0 / 0)
        check_float(op, s_name, s, lead + (m,), what + " (m slots)", device=q.device, finite=s_name == "w" and not step)
    if g is not None:
        check_float(op, "g", g, lead + (m,), what + " (log forget gate, m slots)" +
                    (", the shape of s" if s is not None else ""), device=q.device, log_gate=not step)
    if state is not None:
        H, K, V = q.shape[-2], q.shape[-1], v.shape[-1]
        parts = [("K̃ᵀ", (N, H, K, m), f"[{dim}, H, K, m]"), ("Ṽ", (N, H, m, V), f"[{dim}, H, m, V]"),
                 ("log Σ exp w", (N, H, m), f"[{dim}, H, m]")]
        check_state_tuple(op, state, parts[:n_state], device=q.device)


def _prep(q, s, g, wide=False):
    """(s, g) as the passes take them: g in the decay dtype, s in q's dtype, or float32 where `wide`."""
    if g is not None:
        g = g.to(decay_dtype(q))
    if s is None:
        s = -torch.expm1(g)
    return s.to(torch.float32 if wide else q.dtype), g


def _split(state):
    if state is None:
        return None, None
    if not (isinstance(state, (tuple, list)) and len(state) == 2):
        raise ValueError("GSA states are a tuple (K̃ᵀ [B, H, K, m], Ṽ [B, H, m, V])")
    return state


# The matmul precision parts of (pass 1, pass 2) where the call gives none (ula/core/precision.py), chosen by bf16
# error against fla chunk_gsa's on the quality test's inputs (H100: o 3.19, dq 2.89, dk 2.96, dv 2.85, ds 2.73,
# dg 2.97e-3, benchmarks/results/pending15_h100_session15.log). Pass 2's backward states parts take dg under fla's
# (3.69 -> 2.91e-3, H100). Its split keys would take ds under fla's too (2.75 -> 2.58e-3) but cost 0.20 ms
# (4.62 -> 4.82 ms): pass 2's chunk below does it for less.
PASS_PRECISION = (("own_block",), ("own_block", "states_backward", "q_states_backward"))
# WIDE_S: s in float32 where both passes run fused in half precision, so its two gradients (pass 1's dv, pass 2's
# dk) come out float32 and are summed before one rounding. It lowers ds's bf16 error (H100 2.75 -> 2.19e-3) but
# costs 0.22 ms (the casts and the kernels' float32 reads: H100 B2 T8192 H16 m=64 f+b in CUDA-graph replays
# 4.64 -> 4.86 ms, benchmarks/results/pending14_h100_session15.log), so it is off.
WIDE_S = False
# (pass 1, pass 2) chunk sizes for m <= 64 slots, where the call gives none. Small states, whose sequential steps
# dominate: chunk 128 halves them (H100 B2 T8192 H16 m=64 f+b 4.90 -> 4.77 ms,
# results/tile_sweep_h100_session10_gsa_c128.json). Pass 2 at 64 lowers every bf16 error in the CPU emulation of
# the H100's bf16 (which reproduces the H100's within 2.5%, results/bf16_error_study_gsa_cpu_session15.txt): ds
# under fla's (2.74 -> 2.64e-3, fla 2.73), dg most (2.93 -> 1.87e-3). Its cost, measured with s in float32, was
# 0.09 ms (4.86 -> 4.95, results/pending14_h100_session15.log); with s in bf16 it is still to be measured.
SMALL_M_CHUNKS = (128, 64)


def gsa(q, k, v, s=None, g=None, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        chunk_size=None, backend="auto", precision=None):
    """Gated Slot Attention (see the module docstring). q, k [B, T, H, K]; v [B, T, H, V];
    s, g [B, T, H, m]. States (K̃ᵀ [B, H, K, m], Ṽ [B, H, m, V]) float32 ([N, ...] with cu_seqlens).
    precision: the core's matmul precision for half-precision inputs in both passes (ula/core/precision.py;
    `ula.set_precision` overrides it); None takes PASS_PRECISION, each pass its own measured parts.
    chunk_size: both passes'; None takes SMALL_M_CHUNKS (pass 1, pass 2) for m <= 64 slots, the core's otherwise.
    Returns (o [B, T, H, V], final state tuple or None).
    initial_state, output_final_state, cu_seqlens, chunk_size, backend: as in `ula.linear_attention`."""
    check_sequence(q, k, v, cu_seqlens, chunk_size, backend, scale)
    _check_gsa("gsa", q, v, s, g, initial_state, num_sequences(q, cu_seqlens), "B" if cu_seqlens is None else "N",
               False)
    cu_seqlens = one_sequence_as_batch(q, cu_seqlens)
    if precision is not None:
        parse(precision, "gsa: precision")
    p1, p2 = PASS_PRECISION if precision is None else (precision, precision)
    h1, h2 = _split(initial_state)
    c1 = c2 = chunk_size
    if chunk_size is None and (s if s is not None else g).shape[-1] <= 64:
        c1, c2 = SMALL_M_CHUNKS
    kw = dict(output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_size=c1, backend=backend)
    wide = g is not None and _fused_half(q.dtype, q, q.shape[-1], g.shape[-1], v.shape[-1], kw=kw) and WIDE_S
    s, g = _prep(q, s, g, wide)
    o1, S1 = _first_pass(q, k, s, g, h1, scale, dict(kw, precision=p1))
    p = torch.softmax(o1.to(decay_dtype(q)), -1)
    o, S2 = _second_pass(p, s, v, g, h2, q.dtype, dict(kw, precision=p2, chunk_size=c2))
    return o, ((S1, S2) if output_final_state else None)


def _fused_half(dtype, x, *widths, kw):
    """Whether a pass runs on the Triton kernels with half-precision inputs and no padding of its widths. Also under
    torch.compile: `_core_call` takes the core's custom op there (ula/core/op.py `run`), with p in float32 as eager
    (until session 36 a trace took the public call with bf16 p: compiled ABC's gradients 1.6-2x eager's error)."""
    return (dtype in (torch.float16, torch.bfloat16) and runs_triton(kw["backend"], x.device)
            and not any(_pad_to_16(w) for w in widths))


def _first_pass(q, k, s, g, h1, scale, kw):
    """Pass 1. Half-precision inputs on the Triton kernels with a gate: o1 is taken in float32 (the core's output
    itself where s is float32, else the o it keeps for its right decay's gradient) and its gradient goes back in
    float32, where the public call rounded both to bf16 (bf16 error vs float64 on the CPU emulation,
    benchmarks/results/bf16_error_study_gsa_cpu_session14.txt: dq 2.97 -> 2.80e-3, dk 2.96 -> 2.78e-3), and three
    copies (o1 to bf16 and back, d o1 to bf16) are gone."""
    if g is None or not _fused_half(q.dtype, q, q.shape[-1], s.shape[-1], kw=kw):
        return linear_attention(q, k, s, None, g, scale=scale, initial_state=h1, **kw)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out, S, kept = _core_call(q, k, s, None, g, h1, scale, kw)
    return o_for_grad(out, kept, g), S


def _second_pass(p, s, v, g, h2, dtype, kw):
    """Pass 2 on the softmax output p (float32). Half-precision inputs on the Triton kernels: p enters them in
    float32 (the core call without its one-dtype check; no padding needed). Their matmuls round p once, together
    with its decay factor, where a bf16 copy of p was rounded twice, and dp comes out float32 for the softmax's
    backward (bf16 error vs float64 on the CPU emulation, benchmarks/results/bf16_error_study_gsa_cpu.txt: o 3.76e-3
    -> 3.30e-3, dv 3.71 -> 3.31, ds 3.74 -> 3.31, dq 3.66 -> 3.51, dg 5.32 -> 5.07). Traffic about even: the
    kernels read p in float32 (~5 reads, +2 bytes per element each), no bf16 copies of p and of dp are made."""
    if not _fused_half(dtype, p, p.shape[-1], v.shape[-1], kw=kw):
        return linear_attention(p.to(dtype), s, v, g, None, scale=1.0, initial_state=h2, **kw)
    o, S, _ = _core_call(p, s, v, g, None, h2, 1.0, kw)
    return o, S


def _core_call(q, k, v, ld, rd, h0, scale, kw):
    """The core's autograd call for one pass, its chunk (the call's, else the core's pick for these decays) and
    precision resolved: (o, final state or None, the o kept for a right decay's gradient)."""
    C = kw["chunk_size"] or chunk_fn(kw["backend"], q.device).pick_chunk(ld, rd)
    prec = call_code(kw["precision"], (), "gsa: precision")
    o, S, kept = run(q, k, v, ld, rd, h0, kw["cu_seqlens"], scale, False, C, kw["backend"], None, prec)
    return o, (S if kw["output_final_state"] else None), kept


def gsa_step(q, k, v, s=None, g=None, state=None, *, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V], s, g [B, H, m]; state (K̃ᵀ, Ṽ) or None.
    Returns (o [B, H, V], new state)."""
    check_step_qkv("gsa_step", q, k, v, scale=scale)
    _check_gsa("gsa_step", q, v, s, g, state, q.shape[0], "B", True)
    return _gsa_step(q, k, v, s, g, state, scale)


def _gsa_step(q, k, v, s, g, state, scale):
    s, g = _prep(q, s, g)
    h1, h2 = _split(state)
    o1, S1 = _step(q, k, s, None, g, h1, scale)
    p = torch.softmax(o1.to(decay_dtype(q)), -1).to(q.dtype)
    o, S2 = _step(p, s, v, g, None, h2, 1.0)
    return o, (S1, S2)


def abc(q, k, v, w, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=None,
        backend="auto"):
    """ABC with the paper's write strengths (Eq. 3-4): φ_t = exp(w_t) / Σ_{j<=t} exp(w_j) per slot, from finite slot
    logits w [B, T, H, m], then `gsa(q, k, v, s=φ, g=None)`. The cumulative softmax restarts with each
    sequence; its running log-normalizer log Σ exp(w) [B, H, m] is a third state (None = nothing before).
    States (K̃ᵀ, Ṽ, log Σ exp w). Returns (o, final state tuple or None).
    initial_state, output_final_state, cu_seqlens, chunk_size, backend: as in `ula.linear_attention`."""
    check_sequence(q, k, v, cu_seqlens, chunk_size, backend, scale)
    _check_gsa("abc", q, v, w, None, initial_state, num_sequences(q, cu_seqlens), "B" if cu_seqlens is None else "N",
               False, 3, "w")
    cu_seqlens = one_sequence_as_batch(q, cu_seqlens)
    h1 = h2 = z0 = None
    if initial_state is not None:
        h1, h2, z0 = initial_state
    phi, zT = _cumulative_softmax(w, z0, cu_seqlens, backend)
    o, S = gsa(q, k, v, phi, None, scale=scale, initial_state=None if h1 is None else (h1, h2),
               output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
               backend=backend)
    return o, (S + (zT,) if output_final_state else None)


def _cumulative_softmax(w, z0, cu_seqlens, backend="auto"):
    """φ = exp(w − z) with z_t = log(exp(z0) + Σ_{j<=t} exp(w_j)) per sequence (z0: its state, or nothing), and z at
    each sequence's last step. On the Triton backend (w not float64), its own kernels in float32 with the
    logsumexp's pairs (ula/ops/_abc_softmax_kernels.py). Otherwise PyTorch, packed with one scan over all tokens, no
    padding and no read of cu_seqlens' values (a torch.compile trace cannot read them): each sequence's logits are
    raised by its index times a margin, their finite spread + 800, so every earlier sequence's terms fall below
    exp(−800) of the current one's (0 in float64) and drop out of the sum; the offset comes off after the scan, an
    error of about (margin · N) float64 ulps."""
    if w.dtype != torch.float64 and runs_triton(backend, w.device):
        from ._abc_softmax_op import cumulative_softmax
        return cumulative_softmax(w, z0, cu_seqlens)
    # the running log-normalizer is a scan in float64: at |w| ~ 1e4 float32 spacing (~1e-3) would blur w - z
    out_dt = torch.float64 if w.dtype == torch.float64 else torch.float32
    wd = w.double()
    T = w.shape[1]
    tokens = None if cu_seqlens is None else PackedTokens.of(cu_seqlens, T, w.device)
    if tokens is None:
        z = scan_time(wd, lambda y: torch.logcumsumexp(y, -1))
    else:
        finite = w.detach().nan_to_num(0.0, posinf=0.0, neginf=0.0)  # in w's dtype: a quarter of float64's bytes
        spread = finite.amax().double() - finite.amin().double()  # exact: both are values of w
        offset = ((spread + 800.0) * tokens.seq).view(1, T, 1, 1)
        z = scan_time(wd + offset, lambda y: torch.logcumsumexp(y, -1)) - offset
    if z0 is not None:  # z0 [N, H, m] before every step of its sequence
        z = torch.logaddexp(z, per_step(z0.to(z.dtype), tokens))
    phi = (wd - z).exp().to(out_dt)
    zT = last_step(z, tokens).to(out_dt)
    return phi, zT


def abc_step(q, k, v, w, state=None, *, scale=None):
    """One decoding step of `abc`: w [B, H, m] slot logits; state (K̃ᵀ, Ṽ, log Σ exp w) or None."""
    check_step_qkv("abc_step", q, k, v, scale=scale)
    _check_gsa("abc_step", q, v, w, None, state, q.shape[0], "B", True, 3, "w")
    if state is None:
        h, z = None, w.float() if w.dtype != torch.float64 else w
    else:
        h, z = state[:2], torch.logaddexp(state[2], w.to(state[2].dtype))
    phi = (w.to(z.dtype) - z).exp()
    o, S = _gsa_step(q, k, v, phi, None, h, scale)
    return o, S + (z,)

