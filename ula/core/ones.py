"""Linear attention with a column of ones appended to v, without that column: the normalizer of mLSTMexp and of
normalized linear attention (DESIGN §3's [v, 1] augmentation).

    linear_attention_with_ones(q, k, v, ...) == linear_attention(q, k, [v, 1], ...) split into
    (o [B, T, H, V], den [B, T, H], (S [N, H, K, V], n [N, H, K]))

On the Triton path (decays with one value per step or none, K and V up to 16 or multiples of 16) the forward
kernels form den from the state's extra vector n and the row sums of the scores they already hold: a [v, 1]
column padded to 144 values added ~40% to the output kernel
(benchmarks/results/profile_families_h100_session6.txt) plus copies to pad and slice it. The backward
(ula/core/triton/backward.py, `ones`) carries the column the same way: its gradient enters the dQ and dK passes
as a rank-one term of their scores and an extra vector of their states. Elsewhere the same contract through
linear_attention on [v, 1]."""
from typing import List, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable
from torch import Tensor

from . import op as _op
from . import precision
from .api import _pad_to_16, linear_attention, one_sequence_as_batch
from .autograd import canonical_left
from .backends import chunk_fn, runs_triton
from .checks import check_flag, check_linear_attention, short_repr
from .chunk_layout import make_layout
from .custom_ops import EMPTY, dense_and_packed, fake_like


def with_ones_column(v):
    """[v, 1] along the last dim: the column made explicit (the generic path here, the families' one-step forms,
    where it is also normalized attention's constant key feature)."""
    return torch.cat([v, torch.ones_like(v[..., :1])], -1)


def _check_pair(initial_state, output_final_state):
    """initial_state None or (S0, n0), n0 [..., K] beside S0 [..., K, V] in its dtype and on its device (S0 itself is
    checked as linear_attention's initial_state); output_final_state a bool. The same on every path."""
    check_flag("linear_attention_with_ones", "output_final_state", output_final_state)
    if initial_state is None:
        return
    if not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2
            and all(isinstance(x, torch.Tensor) for x in initial_state)):
        raise TypeError("linear_attention_with_ones: initial_state must be None or a pair of tensors (S0 [.., K, V], "
                        f"n0 [.., K]), got {short_repr(initial_state)}")
    S0, n0 = initial_state
    if tuple(n0.shape) != tuple(S0.shape[:-1]) or n0.dtype != S0.dtype or n0.device != S0.device:
        raise ValueError(f"linear_attention_with_ones: initial_state's n0 must have the shape {tuple(S0.shape[:-1])} "
                         f"(S0's without V), dtype {S0.dtype} and device {S0.device} of S0, got shape "
                         f"{tuple(n0.shape)}, dtype {n0.dtype}, device {n0.device}")


def _generic(q, k, v, ld, scale, initial_state, output_final_state, kw):
    S0 = None if initial_state is None else torch.cat([initial_state[0], initial_state[1].unsqueeze(-1)], -1)
    o, S = linear_attention(q, k, with_ones_column(v), ld, scale=scale, initial_state=S0,
                            output_final_state=output_final_state, **kw)
    V = v.shape[-1]
    return o[..., :V], o[..., V], (None if S is None else (S[..., :V], S[..., V]))


def fast_path(q, v, ld, backend):
    """Whether the call takes the Triton kernels that keep the column implicit (under torch.compile too, as custom
    ops: the explicit column's output and gradient are rounded to v's dtype, and in half precision the dQ and dK
    passes' terms of the column nearly cancel v's: mLSTMexp's bf16 gradients were 5-7e-2 from float64)."""
    K, V = q.shape[-1], v.shape[-1]
    return (runs_triton(backend, q.device) and q.dtype != torch.float64
            and (ld is None or ld.dim() in (1, 3)) and _pad_to_16(K) == 0 and _pad_to_16(V) == 0)


def linear_attention_with_ones(q, k, v, ld=None, *, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, chunk_size=None, backend="auto", key_gate=None, cp_group=None):
    """linear_attention(q, k, [v, 1], ld, ...) as (o, den, final (S, n) or None); initial_state (S0, n0) or None.
    Same arguments as ula.linear_attention (left decay only, forward)."""
    from .context_parallel import raised_everywhere  # (here: that module imports this one)
    with raised_everywhere(cp_group, "linear_attention_with_ones"):  # with cp_group: a failure raises on every rank
        _check_pair(initial_state, output_final_state)
    if cp_group is not None:  # the state [S | n] across the ranks, each rank's slice on the path below
        from .context_parallel import cp_linear_attention
        return cp_linear_attention(q, k, v, ld, cp_group=cp_group, scale=scale, initial_state=initial_state,
                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                   chunk_size=chunk_size, backend=backend, key_gate=key_gate, ones=True)
    kw = dict(cu_seqlens=cu_seqlens, chunk_size=chunk_size, backend=backend, key_gate=key_gate)
    if not fast_path(q, v, ld, backend):
        return _generic(q, k, v, ld, scale, initial_state, output_final_state, kw)
    S0, n0 = (None, None) if initial_state is None else initial_state
    check_linear_attention(q, k, v, ld, None, scale, S0, cu_seqlens, chunk_size, backend, key_gate)
    cu_seqlens = one_sequence_as_batch(q, cu_seqlens)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    C = int(chunk_size) if chunk_size is not None else chunk_fn(backend, q.device).pick_chunk(ld, None)
    prec = precision.encode(precision.resolve(()))  # "fast" unless set_precision says otherwise
    if torch.compiler.is_compiling():
        fwd = ones_fwd if cu_seqlens is None else ones_packed_fwd
        o, den, S, n, _ = fwd(q, k, v, ld, key_gate, S0, n0, scale, cu_seqlens, C, prec)
        return o, den, ((S, n) if output_final_state else None)
    if q.is_cuda:  # a new configuration's kernels compiled in parallel before its first run
        from .triton.precompile import compile_in_parallel, grad_wanted
        grad = grad_wanted(q, k, v, ld, key_gate, S0, n0)
        compile_in_parallel(("ones", q, k, v, ld, key_gate, S0, n0, cu_seqlens, C, grad, prec), q,
                            lambda: _dry_ones(q, k, v, ld, key_gate, S0, n0, scale, cu_seqlens, C, grad, prec))
    o, den, S, n = _OnesFn.apply(q, k, v, ld, key_gate, S0, n0, scale, cu_seqlens, C, prec)
    return o, den, ((S, n) if output_final_state else None)


def _ones_forward(q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, prec, **extra):
    """The forward on the Triton kernels as a dict: o, den, S, n, nb (n at every chunk's border, [B, H, chunks, K]:
    the backward's n_border), and carry, zT, rq where asked for (else None);
    q, k, v contiguous. extra: chunk_output's count0, divide and qnorm (rq: its r of q's rows), and a_part=(e, z0)
    (normalized attention's a part, division and L2 norm of q, ula/ops/_normalized_fused.py): a rank-one feature e
    [B, T, H] float32 of q against a constant key 1, whose state z0 [N, H, V] float32 or None + Σ v the state call
    sums (chunk_output's rank_one mode 1): carry, that state entering each chunk [B * chunks, H, V], and zT, its final
    value [N, H, V]."""
    with precision.active(prec):
        return _ones_forward_kernels(q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, **extra)


def _ones_forward_kernels(q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, **extra):
    from .triton.cumsum import chunk_cumsum
    from .triton.output import chunk_output
    from .triton.state import chunk_states
    from .triton.utils import border_dtype, dot_code, state_dot
    B, T, H, K = q.shape
    f32 = torch.float32
    layout = make_layout(B, T, C, cu_seqlens, q.device)
    dot = dot_code(q, k, v)
    sdot = state_dot(dot)
    gl = canonical_left(ld, T)
    b = chunk_cumsum(gl, layout, False) if gl is not None else None
    uc = u.contiguous() if u is not None else None
    h0 = S0.to(f32).contiguous() if S0 is not None else None
    nz = n0.to(f32).contiguous() if n0 is not None else None
    a_part = extra.pop("a_part", None)
    states = chunk_states(k, v, b, None, h0, layout, False, sdot, border_dtype(q, sdot), gate=uc, ones=True, n0=nz,
                          v_sums=a_part is not None, z0=None if a_part is None else a_part[1])
    border, S, _, (nb, n) = states[:4]
    carry, zT = states[4] if a_part is not None else (None, None)
    if a_part is not None:
        extra["rank_one"] = (1, a_part[0], carry, None, True)
    outs = chunk_output(q, k, v, b, None, border, h0, scale, layout, False, dot, v.dtype, gate=uc,
                        ones=(nb, nz), state_dot=sdot, **extra)
    return dict(o=outs[0], den=outs[1], S=S, n=n, nb=nb, carry=carry, zT=zT, rq=outs[2] if len(outs) > 2 else None)


def _ones_backward(q, k, v, ld, u, S0, n0, do, dden, dS, dn, scale, cu_seqlens, C, need_ld, prec, fwd=None,
                   **extra):
    """The backward's kernels; fwd: (the forward's nb, None or n0 less the forward's initial column) or None (the
    column summed again); extra: fused_backward's dv_rank_one, project, do_weight and q_raw
    (ula/ops/_normalized_fused.py)."""
    from .triton.backward import fused_backward
    with precision.active(prec):
        return fused_backward(q, k, v, ld, S0, do, dS, scale, cu_seqlens, False, C, need_ld, u,
                              ones=(dden, n0, dn, fwd), **extra)


def _dry_ones(q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, grad, prec):
    """Forward and (with grad) backward of one call, for precompile.py's dry run."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    f = _ones_forward(q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, prec)
    if grad:
        _ones_backward(q, k, v, ld, u, S0, n0, torch.empty_like(f["o"]), torch.empty_like(f["den"]), None, None, scale,
                       cu_seqlens, C, ld is not None and ld.requires_grad, prec, (f["nb"], None))


class _OnesFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, prec):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        f = _ones_forward(q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, prec)
        ctx.save_for_backward(q, k, v, ld, u, S0, n0, f["nb"])
        ctx.cfg = (scale, cu_seqlens, C, prec)
        ctx.h0_box = _op._NEXT_BOX[0]  # a context-parallel slice's entering [S | n] (op.BackwardInitialState)
        # unused outputs' gradients arrive as None, not zero tensors (an unused final state would enter the
        # backward's state kernel as a zero dS: a fill and an extra load per step)
        ctx.set_materialize_grads(False)
        return f["o"], f["den"], f["S"], f["n"]

    @staticmethod
    @once_differentiable  # kernels' gradients carry no graph: a second derivative raises
    def backward(ctx, do, dden, dS, dn):
        q, k, v, ld, u, S0, n0, nb = ctx.saved_tensors
        scale, cu_seqlens, C, prec = ctx.cfg
        do = do if do is not None else torch.zeros_like(v)
        need_ld = ld is not None and ctx.needs_input_grad[3]
        S0b, n0b, delta = S0, n0, None
        box = ctx.h0_box
        if box is not None and box.value is not None:  # run from the entering state: the gradients of o + its term
            S0b, n0b = box.value[..., :-1].contiguous(), box.value[..., -1].contiguous()
            delta = n0b.float() if n0 is None else n0b.float() - n0.float()  # the forward's borders are from n0
        dq, dk, dv, dld, dS0, du, dn0 = _ones_backward(q, k, v, ld, u, S0b, n0b, do, dden, dS, dn, scale, cu_seqlens,
                                                       C, need_ld, prec, (nb, delta))
        if S0 is None:  # the box's state is not an input
            dS0 = dn0 = None
        return dq, dk, dv, dld, du, dS0, (None if dn0 is None else dn0.to(n0.dtype)), None, None, None, None


# The same forward and backward as custom ops (custom_ops.py), taken while torch.compile traces.


def _fwd_op(q: Tensor, k: Tensor, v: Tensor, ld: Optional[Tensor], u: Optional[Tensor], S0: Optional[Tensor],
            n0: Optional[Tensor], scale: float, cu_seqlens: Optional[Tensor], C: int,
            prec: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    f = _ones_forward(q.contiguous(), k.contiguous(), v.contiguous(), ld, u, S0, n0, scale, cu_seqlens, C, prec)
    # nb for the backward op, in float32 as the fake function says (without a decay or gate the borders are in the
    # states' dtype); a packed call's count of chunks comes from cu_seqlens' values, which the fake function cannot
    # read: its backward sums the column again
    return f["o"], f["den"], f["S"], f["n"], f["nb"].float() if cu_seqlens is None else q.new_empty(EMPTY)


def _fwd_fake(q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, prec):
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    f32 = torch.float32
    nb = q.new_empty((B, H, -(-T // C), K), dtype=f32) if cu_seqlens is None else q.new_empty(EMPTY)
    return (v.new_empty((B, T, H, V)), q.new_empty((B, T, H), dtype=f32), q.new_empty((N, H, K, V), dtype=f32),
            q.new_empty((N, H, K), dtype=f32), nb)


def _bwd_op(q: Tensor, k: Tensor, v: Tensor, ld: Optional[Tensor], u: Optional[Tensor], S0: Optional[Tensor],
            n0: Optional[Tensor], do: Tensor, dden: Optional[Tensor], dS: Optional[Tensor], dn: Optional[Tensor],
            scale: float, cu_seqlens: Optional[Tensor], C: int, need_ld: bool, prec: str, nb: Tensor) -> List[Tensor]:
    g = _ones_backward(q.contiguous(), k.contiguous(), v.contiguous(), ld, u, S0, n0, do.contiguous(), dden, dS, dn,
                       scale, cu_seqlens, C, need_ld, prec, (nb, None) if nb.numel() else None)
    like = (q, k, v, ld, S0, u, n0)  # the order of _ones_backward's gradients
    return [q.new_empty(EMPTY) if x is None else x.to(y.dtype).contiguous() for x, y in zip(g, like)]


def _bwd_fake(q, k, v, ld, u, S0, n0, do, dden, dS, dn, scale, cu_seqlens, C, need_ld, prec, nb):
    return [fake_like(q, q), fake_like(k, q), fake_like(v, q), fake_like(ld, q, need_ld), fake_like(S0, q),
            fake_like(u, q), fake_like(n0, q)]


def _setup(ctx, inputs, output):
    q, k, v, ld, u, S0, n0, scale, cu_seqlens, C, prec = inputs
    ctx.save_for_backward(q, k, v, ld, u, S0, n0, cu_seqlens, output[4])
    ctx.cfg = (scale, C, prec)


def _grads(ctx, do, dden, dS, dn, _dnb, bwd):
    q, k, v, ld, u, S0, n0, cu_seqlens, nb = ctx.saved_tensors
    scale, C, prec = ctx.cfg
    need_ld = ld is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dld, dS0, du, dn0 = bwd(q, k, v, ld, u, S0, n0, do if do is not None else torch.zeros_like(v), dden,
                                        dS, dn, scale, cu_seqlens, C, need_ld, prec, nb)
    return (dq, dk, dv, dld if need_ld else None, du if u is not None else None, dS0 if S0 is not None else None,
            dn0 if n0 is not None else None, None, None, None, None)


(ones_fwd, _), (ones_packed_fwd, _) = dense_and_packed("ones", _fwd_op, _fwd_fake, _bwd_op, _bwd_fake, _setup,
                                                       _grads)
