"""The core op, two ways around the same forward and backward functions:
- registered with torch.library, so that models calling it compile with torch.compile(fullgraph=True): the
  forward and the backward are opaque custom ops with fake (meta) implementations for tracing; the backward
  is wired with register_autograd (custom_ops.py; packed calls take a second pair, tagged cudagraph_unsafe);
- a plain torch.autograd.Function for eager runs: the custom-op dispatch costs about a millisecond of Python
  per forward+backward (measured on an H100 host), as much as the kernels of a mid-size call.
`run` picks the first while compiling and the second otherwise.

Custom ops cannot return None: absent optional outputs are empty tensors here and become None outside."""
import contextlib
from typing import List, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable
from torch import Tensor

from . import precision
from .autograd import backward_pass, forward_pass
from .backends import chunk_fn, runs_triton
from .custom_ops import EMPTY, dense_and_packed, fake_like, or_empty


def _state_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _keeps_o(q, v, rd):
    """Whether a call returns o in the compute dtype beside o in v's dtype: with a right decay (its gradient needs
    o) where v's dtype is narrower; where it is the compute dtype, the returned o is that o, kept once."""
    return rd is not None and v.dtype != _state_dtype(q)


def o_for_grad(out, o_keep, rd):
    """o in the compute dtype as a right decay's gradient needs it: the kept o, or the output itself where it is in
    that dtype (nothing kept beside it); empty without a right decay."""
    return out if rd is not None and not o_keep.numel() else o_keep


def _forward(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg=None, prec=""):
    """Returns (o in the dtype of v, final state float32/float64, o in the compute dtype where `_keeps_o` else an
    empty tensor). prec: the matmul precision's parts (precision.py)."""
    F = chunk_fn(backend, q.device)
    with precision.active(prec):
        o, S = forward_pass(F, q, k, v, ld, rd, h0, scale, cu_seqlens, reverse, chunk_size, kg)
    # outputs contiguous (as the fake implementation says) and not aliasing each other
    out = o.to(v.dtype).contiguous()
    o_keep = o.contiguous() if _keeps_o(q, v, rd) else o.new_empty(EMPTY)
    return out, S.to(_state_dtype(q)).contiguous(), o_keep


def _backward_impl(q, k, v, ld, rd, h0, o, do, dS, cu_seqlens, scale, reverse, chunk_size, backend, need_ld,
                   need_rd, kg=None, prec=""):
    F = chunk_fn(backend, q.device)
    with precision.active(prec):
        grads = backward_pass(F, q, k, v, ld, rd, h0, o if o.numel() else None, do, dS, scale, cu_seqlens, reverse,
                              chunk_size, need_ld, need_rd, kg)
    return [or_empty(g, q).contiguous() for g in grads]


def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, ld: Optional[Tensor], rd: Optional[Tensor], h0: Optional[Tensor],
              cu_seqlens: Optional[Tensor], scale: float, reverse: bool, chunk_size: int, backend: str,
              kg: Optional[Tensor], prec: str) -> Tuple[Tensor, Tensor, Tensor]:
    return _forward(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg, prec)


def _fwd_fake(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg, prec):
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dt = _state_dtype(q)
    o_keep = q.new_empty((B, T, H, V), dtype=dt) if _keeps_o(q, v, rd) else q.new_empty(EMPTY, dtype=dt)
    return q.new_empty((B, T, H, V), dtype=v.dtype), q.new_empty((N, H, K, V), dtype=dt), o_keep


def _bwd_impl(q: Tensor, k: Tensor, v: Tensor, ld: Optional[Tensor], rd: Optional[Tensor], h0: Optional[Tensor],
              o: Tensor, do: Tensor, dS: Optional[Tensor], cu_seqlens: Optional[Tensor], scale: float, reverse: bool,
              chunk_size: int, backend: str, need_ld: bool, need_rd: bool, kg: Optional[Tensor],
              prec: str) -> List[Tensor]:
    return _backward_impl(q, k, v, ld, rd, h0, o, do, dS, cu_seqlens, scale, reverse, chunk_size, backend, need_ld,
                          need_rd, kg, prec)


def _bwd_fake(q, k, v, ld, rd, h0, o, do, dS, cu_seqlens, scale, reverse, chunk_size, backend, need_ld, need_rd, kg,
              prec):
    return [fake_like(q, q), fake_like(k, q), fake_like(v, q), fake_like(ld, q, need_ld), fake_like(rd, q, need_rd),
            fake_like(h0, q), fake_like(kg, q)]


def _setup_context(ctx, inputs, output):
    q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg, prec = inputs
    ctx.save_for_backward(q, k, v, ld, rd, h0, o_for_grad(output[0], output[2], rd), cu_seqlens, kg)
    ctx.cfg = (scale, reverse, chunk_size, backend, prec)


class BackwardInitialState:
    """A state that the backward of an eager core call uses as its initial state where the forward had none (or
    others): `value` is set after the call, before its backward. Context parallelism (context_parallel.py) runs
    a slice from a zero state (its entering state is not known yet) and adds that state's share of the outputs
    apart; the gradients of the sum are those of one call from the entering state, so the core's own backward,
    given it, forms them all (no separate pass for the entry term's dq and decay gradients)."""

    def __init__(self):
        self.value = None


def padded_state(S, K, V):
    """A state [..., K', V'] set from outside a call (a box's value) at the call's widths K >= K', V >= V': the
    call's were padded for the Triton kernels (api._pad_to_16), the state's are the caller's. Zero rows, columns."""
    pk, pv = K - S.shape[-2], V - S.shape[-1]
    return torch.nn.functional.pad(S, (0, pv, 0, pk)) if pk or pv else S


_NEXT_BOX = [None]  # set by `backward_initial_state` for the eager calls inside it


@contextlib.contextmanager
def backward_initial_state(box):
    """The eager core calls inside take `box` (a BackwardInitialState) for their backward's initial state."""
    _NEXT_BOX[0] = box
    try:
        yield box
    finally:
        _NEXT_BOX[0] = None


def _grads(ctx, do, dS, do_keep, bwd):
    q, k, v, ld, rd, h0, o, cu, kg = ctx.saved_tensors
    scale, reverse, chunk_size, backend, prec = ctx.cfg
    box = getattr(ctx, "h0_box", None)
    h0_in = h0
    if box is not None and box.value is not None:
        h0 = padded_state(box.value, q.shape[-1], v.shape[-1])
    need_ld = ld is not None and ctx.needs_input_grad[3]
    need_rd = rd is not None and ctx.needs_input_grad[4]
    if do_keep is not None and do_keep.numel():  # the kept float32 o was used (GSA's softmax): its gradient too
        do = do_keep if do is None else do_keep + do
    if do is None:  # only the final state was used (eager calls do not materialize zero gradients)
        do = torch.zeros_like(v)
    g = bwd(q, k, v, ld, rd, h0, o, do.contiguous(), dS, cu, scale, reverse, chunk_size, backend, need_ld, need_rd,
            kg, prec)
    dld = g[3] if need_ld else None
    drd = g[4] if need_rd else None
    dh0 = g[5] if h0_in is not None else None
    dkg = g[6] if kg is not None else None
    return g[0], g[1], g[2], dld, drd, dh0, None, None, None, None, None, dkg, None


(linear_attention_fwd, linear_attention_bwd), (packed_fwd, packed_bwd) = dense_and_packed(
    "linear_attention", _fwd_impl, _fwd_fake, _bwd_impl, _bwd_fake, _setup_context, _grads)


class _Eager(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *inputs):
        out = _forward(*inputs)
        _setup_context(ctx, inputs, out)
        ctx.h0_box = _NEXT_BOX[0]
        if not out[2].numel():
            ctx.mark_non_differentiable(out[2])
        # an unused final state gets None, not a zero tensor (a fill per backward; the kernels skip a None dS)
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, do, dS, do_keep):
        # create_graph=True on the Triton kernels: their gradients carry no graph, so a second derivative raises (the
        # PyTorch path's backward is made of differentiable ops and stays twice differentiable)
        if torch.is_grad_enabled() and runs_triton(ctx.cfg[3], ctx.saved_tensors[0].device):
            return _grads_once(ctx, do, dS, do_keep)
        return _grads(ctx, do, dS, do_keep, _backward_impl)


@once_differentiable
def _grads_once(ctx, do, dS, do_keep):
    return _grads(ctx, do, dS, do_keep, _backward_impl)


def run(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg=None, prec=""):
    """(o, final state, o kept for a right decay's gradient): the custom op while compiling, else the eager
    autograd.Function (same functions inside). With a right decay and v narrower than the compute dtype (float32 for
    half-precision inputs) the kept o is o in that dtype, differentiable like o: a caller may read it instead of o's
    rounded copy (`o_for_grad` picks whichever of the two is in the compute dtype).
    prec: precision.encode's string of the matmul precision's parts. scale: a number (the caller's default
    resolved)."""
    wide = _wide_decay(q, v, ld, rd, backend)
    if wide:
        return _run_split(wide, q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg, prec)
    if torch.compiler.is_compiling():
        op = linear_attention_fwd if cu_seqlens is None else packed_fwd
    else:
        op = _Eager.apply
        if q.is_cuda and runs_triton(backend, q.device):  # a new configuration's kernels compiled in parallel
            from .triton.precompile import compile_in_parallel, grad_wanted
            grad = grad_wanted(q, k, v, ld, rd, h0, kg)
            compile_in_parallel(("core", q, k, v, ld, rd, h0, cu_seqlens, reverse, chunk_size, kg, grad, prec), q,
                                lambda: dry_call(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend,
                                                 kg, grad, prec))
    return op(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg, prec)


# With a per-feature decay (a vector left decay, a right decay) the Triton kernels hold all of K, or all of V in
# the backward's swapped roles, in one tile of at most this many features (output.py's BKF); wider ones were left
# out, silently. A wider call runs as calls of at most this many features each.
WIDEST_DECAYED = 256


def _wide_decay(q, v, ld, rd, backend):
    """"K" or "V": a width to split (K first), for a call with a per-feature decay on the Triton kernels; else
    None. Either split is exact: under diag(exp ld) S diag(exp rd) the state's rows, and its columns, evolve
    independently."""
    if not ((ld is not None and ld.dim() == 4) or rd is not None):
        return None
    K, V = q.shape[-1], v.shape[-1]
    if max(K, V) <= WIDEST_DECAYED or not runs_triton(backend, q.device):
        return None
    return "K" if K > WIDEST_DECAYED else "V"


def _run_split(dim, q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg, prec):
    """`run` as calls over blocks of WIDEST_DECAYED features of dim: along K every block of rows of the state is a
    recurrence of its own and o = Sᵀ q sums over them; along V the state's columns, and o's, are independent. The
    final state is the blocks' states side by side."""
    if _NEXT_BOX[0] is not None:
        raise ValueError(f"a per-feature decay over {dim} = {q.shape[-1] if dim == 'K' else v.shape[-1]} > "
                         f"{WIDEST_DECAYED} features is not supported here (context parallelism or a time split on "
                         "the Triton kernels); use backend='torch' or a head size of at most 256")
    width = q.shape[-1] if dim == "K" else v.shape[-1]
    parts = []
    for a in range(0, width, WIDEST_DECAYED):
        f = slice(a, min(a + WIDEST_DECAYED, width))
        cut = lambda x: None if x is None else x[..., f].contiguous()  # noqa: E731
        if dim == "K":
            h = None if h0 is None else h0[..., f, :].contiguous()
            lk = ld if ld is None or ld.dim() < 4 else cut(ld)
            parts.append(run(cut(q), cut(k), v, lk, rd, h, cu_seqlens, scale, reverse, chunk_size, backend, kg, prec))
        else:
            parts.append(run(q, k, cut(v), ld, cut(rd), cut(h0), cu_seqlens, scale, reverse, chunk_size, backend, kg,
                             prec))
    outs, states, kept = zip(*parts)
    if dim == "K":
        o = torch.stack([x.to(_state_dtype(q)) for x in outs]).sum(0).to(v.dtype) if len(outs) > 1 else outs[0]
        keep = torch.stack(kept).sum(0) if kept[0].numel() else kept[0]
        return o, torch.cat(states, -2), keep
    return torch.cat(outs, -1), torch.cat(states, -1), torch.cat(kept, -1) if kept[0].numel() else kept[0]


def dry_call(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg, grad, prec=""):
    """The eager call's forward and (with grad) backward, for precompile.py's dry run (nothing it returns is read)."""
    out, _, o_keep = _forward(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, backend, kg, prec)
    if grad:
        _backward_impl(q, k, v, ld, rd, h0, o_for_grad(out, o_keep, rd), torch.empty_like(out), None, cu_seqlens,
                       scale, reverse, chunk_size, backend, ld is not None and ld.requires_grad,
                       rd is not None and rd.requires_grad, kg, prec)
