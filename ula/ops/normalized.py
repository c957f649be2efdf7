"""Normalized linear attention (paper 001), kernel f(x) = a + b x, causal (Eq. 4):

    o_i = Σ_{n<=i} (a + b q_i·k_n) v_n  /  Σ_{n<=i} (a + b q_i·k_n)

with optional row-wise L2 normalization of q and k first (Eq. 22).

Numerator and denominator together: q' = [b q, a], k' = [k, 1], v' = [v, 1] make q'_i·k'_n = a + b q_i·k_n,
so column j < V of Σ (q'_i·k'_n) v'_n is the numerator and the last column the denominator. This is the
augmentation of DESIGN §3 with a, b moved entirely to the query side (no square roots: a, b may be zero or
negative and their gradients stay finite). The chunked path splits q'·k' in its two parts, so the core call
keeps K features (K + 1 would add a tile of one feature to every matmul):
    o'_i = b · core(q, k, v')_i  +  a · Σ_{n<=i} v'_n      (one core call, v' = [v, 1]; a cumulative sum)
The core call keeps the column of ones implicit (ula/core/ones.py: the kernels form its column from the scores'
row sums), and the a part's last column is the count of steps.
The state is S = Σ k'_n v'_nᵀ [B, H, K+1, V+1] (Σ k vᵀ, Σ k, Σ vᵀ, count), independent of a and b, so a and
b can change between calls; memory stays O(T·D).

The denominator. With qk_l2_norm=True, |q_i·k_n| <= 1, so for a > |b| every term is at least a − |b| > 0
and the denominator is >= (a − |b|)·i (plus what an initial state adds). Other combinations can reach
zero; there the denominator's magnitude is clamped to at least `eps`, keeping its sign (a zero counts
as positive). The clamp changes nothing when a > |b| with L2 norm (and no initial state cancelling it),
as long as (a − |b|) >= eps.

On the Triton backend, where the column-of-ones kernels take K and V (ula/core/ones.py), the whole op is one
autograd Function (ula/ops/_normalized_fused.py): the a part and the division inside the core's kernels, and with a
float b (the core's scale) the L2 norm's backward in its dQ and dK passes. Other widths take the core call with
[v, 1] and the epilogue as fused Functions (ula/ops/_l2norm.py, ula/ops/_normalized_epilogue.py); `_epilogue_torch`
is the same epilogue in PyTorch (backend="torch", float64, and the fused one's reference)."""
import torch
import torch.nn.functional as F

from ..core.api import one_sequence_as_batch
from ..core.backends import chunk_fn, runs_triton
from ..core.checks import check_device, check_flag, check_linear_attention
from ..core.ones import fast_path, linear_attention_with_ones, with_ones_column
from ..core.time_scan import scan_time
from ._checks import check_number, check_sequence, check_step_qkv, check_step_state, num_sequences
from ._common import PackedTokens, _step, cumsum_per_sequence, decay_dtype, last_step, per_step


def _check_coefs(op, a, b, q, qk_l2_norm, eps):
    """Tensors a, b on the device of q, like every other argument; a 0-d CPU tensor is the exception (moved to q's
    device, as torch takes CPU scalars beside tensors of any device). Numbers a, b finite; eps a number > 0 (the
    least magnitude of the denominator); qk_l2_norm a bool."""
    for name, x in (("a", a), ("b", b)):
        if isinstance(x, torch.Tensor) and not (x.dim() == 0 and x.device.type == "cpu"):
            check_device(name, x, q.device, op)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            check_number(op, name, x)
    check_flag(op, "qk_l2_norm", qk_l2_norm)
    check_number(op, "eps", eps, positive=True, what=" (the least magnitude of the denominator)")


def _coef(name, x, like):
    """a or b (float or tensor of shape [] or [H]) -> a float, or a tensor broadcastable to [..., H, 1] in like's
    dtype."""
    H = like.shape[-2]
    if isinstance(x, bool) or not isinstance(x, (int, float, torch.Tensor)):
        raise TypeError(f"normalized_linear_attention: {name} must be a float, a 0-d tensor or an [H] tensor "
                        f"with H = {H}, got {type(x).__name__}")
    if isinstance(x, torch.Tensor) and not x.is_floating_point():
        raise TypeError(f"normalized_linear_attention: {name} must be a floating-point tensor, got {x.dtype}")
    if not isinstance(x, torch.Tensor):  # a number stays a number (a tensor made from it would be a blocking copy)
        return float(x)
    x = x.to(device=like.device, dtype=like.dtype)
    if x.dim() == 0:
        return x.view(1)
    if x.dim() != 1 or x.shape[0] != H:
        raise ValueError(f"normalized_linear_attention: {name} must be a float, a 0-d tensor or an [H] tensor "
                         f"with H = {H}, got shape {tuple(x.shape)}")
    return x.unsqueeze(-1)


def _normed(q, k, fused):
    """q, k L2-normalized per row (Eq. 22); fused: on Triton kernels (ula/ops/_l2norm.py)."""
    if fused:
        from ._l2norm import l2_normalize
        return l2_normalize(q, k)
    # back to the inputs' dtype: CUDA autocast runs the norm in float32 and returns float32
    return F.normalize(q, dim=-1).to(q.dtype), F.normalize(k, dim=-1).to(k.dtype)


def _parts(q, k, a, b, qk_l2_norm, fused=False):
    """(b q, k, a) after the optional L2 normalization; a, b floats or broadcastable to [..., H, 1].
    fused: the norm on Triton kernels (ula/ops/_l2norm.py)."""
    a, b = _coef("a", a, q), _coef("b", b, q)
    if qk_l2_norm:
        q, k = _normed(q, k, fused)
    return (q if isinstance(b, float) and b == 1.0 else b * q), k, a


def _augment(q, k, v, a, b, qk_l2_norm):
    """q' = [b q, a], k' = [k, 1], v' = [v, 1] (the one-step form)."""
    qb, k, a = _parts(q, k, a, b, qk_l2_norm)
    va = with_ones_column(v)
    a = qb.new_full((*qb.shape[:-1], 1), a) if isinstance(a, float) else a.expand(*qb.shape[:-1], 1)
    qa = torch.cat([qb, a], -1)
    ka = with_ones_column(k)
    return qa, ka, va


def _divide(num, den, eps):
    den = torch.where(den >= 0, den.clamp_min(eps), den.clamp_max(-eps))
    return num / den


def _running_sums(v, tokens, dd):
    """Per sequence Z_t = Σ_{n<=t} v_n in dd and the count of steps C_t in float64 ([B, T, H]); tokens: the
    PackedTokens of a packed call, else None. Packed, the sums are taken in float64 (cumsum_per_sequence subtracts)."""
    B, T, H = v.shape[:3]
    if tokens is None:
        zc = torch.arange(1, T + 1, device=v.device, dtype=torch.float64).view(1, T, 1).expand(B, T, H)
        return scan_time(v.to(dd), lambda y: y.cumsum(-1)), zc
    zc = (tokens.pos + 1).to(torch.float64).view(1, T, 1).expand(1, T, H)
    return cumsum_per_sequence(v.double(), tokens).to(dd), zc


def _epilogue_torch(o, den, v, a, z0, c0, eps, cu_seqlens, final):
    """The epilogue in PyTorch (backend="torch", float64 inputs; the reference of ._normalized_epilogue, which
    has the same contract): per sequence, Z_t = z0 + Σ_{n<=t} v_n, C_t = c0 + count of steps,
    out = (o + a Z) / clamp_sign(den + a C, eps) in v's dtype, and (Z, C) at each sequence's last step when
    `final`. a: a float or a tensor broadcastable to [H, 1]; z0 [N, H, V], c0 [N, H] or None."""
    dd = torch.float64 if torch.float64 in (o.dtype, v.dtype) else torch.float32
    a_part = not (isinstance(a, float) and a == 0.0)  # a = 0: the sums only for the final state
    if a_part or final:
        # C and den + a C in float64 (one value per row): near 0 the sum cancels, and float32 rounding there
        # is an error that the division multiplies.
        tokens = None if cu_seqlens is None else PackedTokens.of(cu_seqlens, v.shape[1], v.device)
        zv, zc = _running_sums(v, tokens, dd)
        if z0 is not None:
            zv = zv + per_step(z0.to(dd), tokens)
        if c0 is not None:
            zc = zc + per_step(c0.to(torch.float64), tokens)
    num = o.to(dd)
    den = den.to(dd)
    if a_part:
        if isinstance(a, float):
            num = num + a * zv
        else:  # a's gradient, Σ dnum · Z over every step and feature, summed in float64: float32 sums cancel there
            # (da 1.5e-4 from float64 on one draw of the tests, where the float32 recurrence had 4.8e-6)
            num = (num.to(torch.float64) + a.to(torch.float64) * zv.to(torch.float64)).to(dd)
        a64 = a if isinstance(a, float) else a.to(torch.float64).squeeze(-1)
        den = (den.to(torch.float64) + a64 * zc).to(dd)
    out = _divide(num, den.unsqueeze(-1), eps).to(v.dtype)
    if not final:
        return out, None
    return out, (last_step(zv, tokens), last_step(zc, tokens).to(dd))


def normalized_linear_attention(q, k, v, a=1.0, b=1.0, *, qk_l2_norm=True, eps=1e-6, initial_state=None,
                                output_final_state=False, cu_seqlens=None, chunk_size=None, backend="auto"):
    """Causal linear attention with kernel a + b x and normalization (paper 001, Eq. 4 and 22).

    q, k [B, T, H, K]; v [B, T, H, V]; a, b floats or tensors ([] or [H], learnable: gradients flow) on the
    device of q (a 0-d CPU tensor is also taken, and moved there). No `scale` argument: b is the scale of q·k.
    initial_state / final state [B, H, K+1, V+1] float32 (see the module docstring for its layout).
    Returns (o [B, T, H, V], final state or None). qk_l2_norm: q and k each divided by its L2 norm over K first
    (Eq. 22, as F.normalize); eps: the least magnitude of the denominator. output_final_state, cu_seqlens,
    chunk_size, backend: as in `ula.linear_attention`.
    Precision: with bf16 / fp16 inputs the backward reads the stored output (as FlashAttention's does), and the
    gradient of `a` is a difference of two sums near each other (Σ dnum·Z against Σ dnum·out·C): it carries the
    output's rounding amplified: 1e-2 to 1e-1 of its largest element against float64 at T=29, H=2 (db 3e-3 to
    1.4e-2)."""
    check_sequence(q, k, v, cu_seqlens, chunk_size, backend)
    _check_coefs("normalized_linear_attention", a, b, q, qk_l2_norm, eps)
    if initial_state is not None:
        N, _, H, K = (num_sequences(q, cu_seqlens),) + tuple(q.shape[1:])
        check_step_state("normalized_linear_attention", initial_state, (N, H, K + 1, v.shape[-1] + 1),
                         "[B, H, K + 1, V + 1] ([N, ...] with cu_seqlens)", name="initial_state", device=q.device)
    cu_seqlens = one_sequence_as_batch(q, cu_seqlens)
    # the Triton backend (not float64): the main branch below is one Function, a custom op under torch.compile
    # (ula/ops/_normalized_op.py); elsewhere the L2 norm and the epilogue are fused Functions, not under
    # torch.compile (opaque to it; runs_fused's rule, without asking the backend twice)
    triton = decay_dtype(q) == torch.float32 and runs_triton(backend, q.device)
    fused = triton and not torch.compiler.is_compiling()
    K, V = k.shape[-1], v.shape[-1]
    S0 = initial_state
    init = None if S0 is None else (S0[:, :, :K, :V].contiguous(), S0[:, :, :K, V].contiguous())
    z0, c0 = (None, None) if S0 is None else (S0[:, :, K, :V], S0[:, :, K, V])
    if triton and fast_path(q, v, None, backend):
        # a float b is the core's scale, and with it the L2 norm's backward is formed by the core's dQ and dK passes
        # where a row fits one tile (ula/ops/_normalized_fused.py)
        from ..core.triton.output import project_fits
        a, b = _coef("a", a, q), _coef("b", b, q)
        b_is_scale = isinstance(b, float) and b != 0.0
        l2_in = qk_l2_norm and b_is_scale and project_fits(K)
        if qk_l2_norm and not l2_in:
            q, k = _normed(q, k, fused)  # (under torch.compile F.normalize)
        out, fin, last = _fused(q if b_is_scale else b * q, k, v, a, b if b_is_scale else 1.0, l2_in, init, z0, c0,
                                eps, cu_seqlens, chunk_size, backend, output_final_state)
        return out, _final_state(fin, last)
    qb, k, a = _parts(q, k, a, b, qk_l2_norm, fused)
    # the b part with its normalizer: values [v, 1] in one core call, the column of ones implicit
    o, den, fin = linear_attention_with_ones(qb, k, v, scale=1.0, initial_state=init,
                                             output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                             chunk_size=chunk_size, backend=backend)
    # the a part: a · (z0 + Σ_{n<=i} [v_n, 1]) per sequence (the count of steps for the column of ones), z0 the
    # last row of the initial state; then the division
    epilogue = _epilogue_torch
    if fused:
        from ._normalized_epilogue import normalized_epilogue as epilogue  # one fused Function (Triton kernels)
    out, last = epilogue(o, den, v, a, z0, c0, eps, cu_seqlens, fin is not None)
    return out, _final_state(fin, last)


def _fused(qb, k, v, a, scale, l2, init, z0, c0, eps, cu_seqlens, chunk_size, backend, final):
    """The Triton path as one Function (._normalized_fused): (out, (S, n) or None, (Z_T, C_T) or None). qb: q times
    b unless b is `scale` (a float); l2: q and k still to be L2-normalized (inside the Function)."""
    from . import _normalized_epilogue as epi
    from ._normalized_fused import normalized_fused
    B, T, H = v.shape[:3]
    S0, n0 = (None, None) if init is None else init
    check_linear_attention(qb, k, v, None, None, scale, S0, cu_seqlens, chunk_size, backend, None)
    C = int(chunk_size) if chunk_size is not None else chunk_fn(backend, qb.device).pick_chunk(None, None)
    a_h, a_val, has_a = epi.coefficient_a(a, H, final)
    f32 = lambda x: None if x is None else x.to(torch.float32).contiguous()  # noqa: E731
    out, S, n, zT = normalized_fused(qb, k, v, a_h, a_val, scale, l2, f32(S0), f32(n0), f32(z0), f32(c0), eps,
                                     cu_seqlens, C, has_a)
    if not final:
        return out, None, None
    return out, (S, n), (zT, epi.final_count(f32(c0), cu_seqlens, B, T, H, v.device))


def _final_state(fin, last):
    """[N, H, K + 1, V + 1] from the core's (S, n) and the a part's (Z_T, C_T); None without them."""
    if fin is None:
        return None
    top = torch.cat([fin[0], fin[1].unsqueeze(-1)], -1)  # [N, H, K, V + 1]
    bottom = torch.cat([last[0], last[1].unsqueeze(-1)], -1).to(top.dtype)  # [N, H, V + 1]
    return torch.cat([top, bottom.unsqueeze(2)], 2)


def normalized_linear_attention_step(q, k, v, a=1.0, b=1.0, state=None, *, qk_l2_norm=True, eps=1e-6):
    """One decoding step: q, k [B, H, K], v [B, H, V], state [B, H, K+1, V+1] or None; a, b as in
    `normalized_linear_attention`. Returns (o [B, H, V], new state)."""
    op = "normalized_linear_attention_step"
    check_step_qkv(op, q, k, v)
    _check_coefs(op, a, b, q, qk_l2_norm, eps)
    check_step_state(op, state, q.shape[:2] + (q.shape[2] + 1, v.shape[-1] + 1), "[B, H, K + 1, V + 1]",
                     device=q.device)
    qa, ka, va = _augment(q, k, v, a, b, qk_l2_norm)
    o, S = _step(qa, ka, va, None, None, state, 1.0)
    return _divide(o[..., :-1], o[..., -1:], eps), S
