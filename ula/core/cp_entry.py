"""The term that the state E entering a context-parallel slice adds to the outputs of the slice's entry piece
(ula/core/context_parallel.py, step 4):

    corr_t = scale · exp(c_t) ⊙ (Eᵀ (exp(b_t) ⊙ q_t))

b_t, c_t: cumulative left / right log decays from the slice's entry side (`cum_log`). All exponents are <= 0.

One autograd function with its own backward: it keeps only its inputs (q and the decays are views of tensors
that the core call keeps anyway; E is one state) and recomputes the exponentials there. Autograd through the
plain expression kept float32 copies of the whole slice from the forward to the backward ([L, H, K] and
[L, H, V] per sequence, gigabytes at L = 131072). With bfloat16 inputs the matmuls take bfloat16 operands
(tensor cores, float32 accumulation), as the core's own inter-chunk term reads its bfloat16 border states (not
float16: a state can exceed its range)."""
import torch
from torch.autograd.function import once_differentiable

from .backends import runs_triton
from .time_scan import scan_time


def cum_log(x, reverse):
    """Cumulative log decay along dim 1 from the slice's entry side: inclusive from the start (forward); from
    the end exclusive of the step itself (reverse: step t is reached from t+1 by the decay of t+1)."""
    if not reverse:
        return scan_time(x, lambda y: y.cumsum(-1))
    r = scan_time(x, lambda y: y.flip(-1).cumsum(-1).flip(-1))
    return torch.cat([r[:, 1:], torch.zeros_like(r[:, :1])], 1)


def _cum_log_adjoint(d, reverse):
    """The transpose of `cum_log` (linear along dim 1): a reverse inclusive cumsum, or a shifted forward one."""
    if not reverse:
        return scan_time(d, lambda y: y.flip(-1).cumsum(-1).flip(-1))
    r = scan_time(d, lambda y: y.cumsum(-1))
    return torch.cat([torch.zeros_like(r[:, :1]), r[:, :-1]], 1)


def _dtypes(q, wide=False):
    """(dtype of the decay arithmetic, dtype of the matmul operands: float32 too where `wide`)."""
    sdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    return sdt, (torch.bfloat16 if q.dtype == torch.bfloat16 and not wide else sdt)


def _weighted(x, g, sdt, mm, reverse):
    """x ⊙ exp(cum_log(g)) in the matmul dtype (x itself where g is None)."""
    if g is None:
        return x.to(mm)
    w = torch.exp(cum_log(g.to(sdt), reverse))
    return x.to(sdt) * w if mm == sdt else x * w.to(x.dtype)


class _EntryTerm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, gl, rd, E, scale, reverse, wide):
        ctx.save_for_backward(q, gl, rd, E)
        ctx.cfg = (scale, reverse, wide)
        sdt, mm = _dtypes(q, wide)
        corr = torch.einsum("blhk,bhkv->blhv", _weighted(q, gl, sdt, mm, reverse), E.to(mm))
        if rd is not None:
            return (corr.to(sdt) * torch.exp(cum_log(rd.to(sdt), reverse)) * scale).to(mm)
        return corr * scale

    @staticmethod
    def backward(ctx, dC):
        q, gl, rd, E = ctx.saved_tensors
        scale, reverse, wide = ctx.cfg
        sdt, mm = _dtypes(q, wide)
        ql = _weighted(q, gl, sdt, mm, reverse)
        Em = E.to(mm)
        drd = None
        if rd is not None:
            dC = dC.to(sdt) * torch.exp(cum_log(rd.to(sdt), reverse))
            if ctx.needs_input_grad[2]:  # d cum_t = dC_t ⊙ exp(c_t) ⊙ (the term before exp(c_t))
                corr = torch.einsum("blhk,bhkv->blhv", ql, Em).to(sdt)
                drd = _cum_log_adjoint((dC * corr * scale).sum_to_size(rd.shape), reverse).to(rd.dtype)
        dC = dC.to(mm)
        dql = torch.einsum("blhv,bhkv->blhk", dC, Em) * scale if any(ctx.needs_input_grad[:2]) else None
        dE = (torch.einsum("blhk,blhv->bhkv", ql, dC) * scale).to(E.dtype) if ctx.needs_input_grad[3] else None
        dgl = None
        if gl is not None and ctx.needs_input_grad[1]:
            # d cum_t = dql_t ⊙ q_t ⊙ exp(cum_t) = dql_t ⊙ ql_t
            dgl = _cum_log_adjoint((dql.to(sdt) * ql.to(sdt)).sum_to_size(gl.shape), reverse).to(gl.dtype)
        dq = None
        if ctx.needs_input_grad[0]:
            dq = (_weighted(dql, gl, sdt, mm, reverse) if gl is not None else dql).to(q.dtype)
        return dq, dgl, drd, dE, None, None, None


def entry_term(q, gl, rd, E, scale, reverse, wide=False):
    """corr [B, L, H, V] (bfloat16 for bfloat16 q, else float32 / float64) for q [B, L, H, K], left log decays gl
    broadcastable to [B, L, H, K] (or None), right ones rd [B, L, H, V] (or None), E [B, H, K, V].
    wide: float32 matmul operands both ways (and a float32 corr), for a term whose gradient must not be rounded
    (the den column of context_parallel.py's `ones`)."""
    return _EntryTerm.apply(q, gl, rd, E, float(scale), bool(reverse), bool(wide))


class _EntryTermTriton(torch.autograd.Function):
    """o + corr through the kernels of ula/core/triton/entry.py (left decays, forward direction); with a column En
    beside E (mLSTMexp's normalizer) also den + its term, float32 both ways, from the same reads of q."""

    @staticmethod
    def forward(ctx, o, q, gl, E, den, En, scale):
        from .triton.entry import chunk_carry, entry_forward
        from .triton.utils import alloc
        carry = None if gl is None else chunk_carry(gl, q.shape[1])
        E = E.contiguous()
        col = None
        ctx.en_dtype = None if En is None else En.dtype
        if den is not None:
            En = En[..., 0].float().contiguous()
            col = (En, den, alloc(den.shape, den.device, den.dtype))
        ctx.save_for_backward(q, gl, E, carry, En)
        ctx.scale = scale
        out = entry_forward(q, gl, E, o, scale, carry, column=col)
        return out, (None if col is None else col[2])

    @staticmethod
    @once_differentiable  # kernels' gradients carry no graph: a second derivative raises
    def backward(ctx, dout, dden):
        from .triton.entry import entry_backward
        q, gl, E, carry, En = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        need = ctx.needs_input_grad
        col = None
        if En is not None:
            col = (En, torch.zeros(dout.shape[:-1], dtype=torch.float32, device=dout.device) if dden is None
                   else dden)
        dq, dg, dE, dEn = entry_backward(q, gl, E, dout, ctx.scale, carry, need[1], need[2], need[3] or need[5],
                                         column=col)
        dg = None if dg is None else dg.sum_to_size(gl.shape).to(gl.dtype)
        dE = None if dE is None or not need[3] else dE.to(E.dtype)
        dEn = None if dEn is None or not need[5] else dEn.unsqueeze(-1).to(ctx.en_dtype)
        return dout, dq, dg, dE, dden, dEn, None


ENTRY_KERNEL_MAX_K = 256  # the kernels hold all of K in one tile (ula/core/triton/entry.py)


def add_entry_term(o, q, gl, rd, E, scale, reverse, backend, column=None):
    """o + corr (o [B, L, H, V], the slice's entry piece): the Triton kernels where the core runs them (left
    decays, forward direction, K <= 256, with a column no decay per feature; float64 stays in PyTorch), the
    PyTorch form above otherwise. Inputs given detached get no gradient (only E's is formed: context_parallel.py
    leaves the others to the core). column: (den [B, L, H], En [B, H, K, 1]), a column beside E (mLSTMexp's
    normalizer), formed from the same reads of q with float32's precision both ways (its gradient must not be
    rounded; see `entry_term`'s wide): then (o + corr, den + its term)."""
    if (rd is None and not reverse and q.dtype != torch.float64 and q.shape[-1] <= ENTRY_KERNEL_MAX_K
            and runs_triton(backend, q.device) and not (column is not None and gl is not None and gl.shape[-1] > 1)):
        den, En = column if column is not None else (None, None)
        out, den_out = _EntryTermTriton.apply(o, q, gl, E, den, En, float(scale))
        return out if column is None else (out, den_out)
    out = o + entry_term(q, gl, rd, E, scale, reverse).to(o.dtype)
    if column is None:
        return out
    den, En = column
    return out, den + entry_term(q, gl, rd, En, scale, reverse, wide=True)[..., 0].to(den.dtype)
