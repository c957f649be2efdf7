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


def _dtypes(q):
    """(dtype of the decay arithmetic, dtype of the matmul operands)."""
    sdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    return sdt, (torch.bfloat16 if q.dtype == torch.bfloat16 else sdt)


def _weighted(x, g, sdt, mm, reverse):
    """x ⊙ exp(cum_log(g)) in the matmul dtype (x itself where g is None)."""
    if g is None:
        return x.to(mm)
    w = torch.exp(cum_log(g.to(sdt), reverse))
    return x.to(sdt) * w if mm == sdt else x * w.to(x.dtype)


class _EntryTerm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, gl, rd, E, scale, reverse):
        ctx.save_for_backward(q, gl, rd, E)
        ctx.cfg = (scale, reverse)
        sdt, mm = _dtypes(q)
        corr = torch.einsum("blhk,bhkv->blhv", _weighted(q, gl, sdt, mm, reverse), E.to(mm))
        if rd is not None:
            return (corr.to(sdt) * torch.exp(cum_log(rd.to(sdt), reverse)) * scale).to(mm)
        return corr * scale

    @staticmethod
    def backward(ctx, dC):
        q, gl, rd, E = ctx.saved_tensors
        scale, reverse = ctx.cfg
        sdt, mm = _dtypes(q)
        ql = _weighted(q, gl, sdt, mm, reverse)
        Em = E.to(mm)
        drd = None
        if rd is not None:
            dC = dC.to(sdt) * torch.exp(cum_log(rd.to(sdt), reverse))
            if ctx.needs_input_grad[2]:  # d cum_t = dC_t ⊙ exp(c_t) ⊙ (the term before exp(c_t))
                corr = torch.einsum("blhk,bhkv->blhv", ql, Em).to(sdt)
                drd = _cum_log_adjoint((dC * corr * scale).sum_to_size(rd.shape), reverse).to(rd.dtype)
        dC = dC.to(mm)
        dql = torch.einsum("blhv,bhkv->blhk", dC, Em) * scale
        dE = (torch.einsum("blhk,blhv->bhkv", ql, dC) * scale).to(E.dtype) if ctx.needs_input_grad[3] else None
        dgl = None
        if gl is not None and ctx.needs_input_grad[1]:
            # d cum_t = dql_t ⊙ q_t ⊙ exp(cum_t) = dql_t ⊙ ql_t
            dgl = _cum_log_adjoint((dql.to(sdt) * ql.to(sdt)).sum_to_size(gl.shape), reverse).to(gl.dtype)
        dq = None
        if ctx.needs_input_grad[0]:
            dq = (_weighted(dql, gl, sdt, mm, reverse) if gl is not None else dql).to(q.dtype)
        return dq, dgl, drd, dE, None, None


def entry_term(q, gl, rd, E, scale, reverse):
    """corr [B, L, H, V] (bfloat16 for bfloat16 q, else float32 / float64) for q [B, L, H, K], left log decays gl
    broadcastable to [B, L, H, K] (or None), right ones rd [B, L, H, V] (or None), E [B, H, K, V]."""
    return _EntryTerm.apply(q, gl, rd, E, float(scale), bool(reverse))


class _EntryTermTriton(torch.autograd.Function):
    """o + corr through the kernels of ula/core/triton/entry.py (left decays, forward direction). With a
    `DeferredGrads` box, q and gl come in detached: the backward forms dE (wanted first, by the previous rank)
    and leaves dq, dg to the box, which adds them to the core's own gradients once those exist."""

    @staticmethod
    def forward(ctx, o, q, gl, E, scale, box):
        from .triton.entry import chunk_carry, entry_forward
        carry = None if gl is None else chunk_carry(gl, q.shape[1])
        E = E.contiguous()
        ctx.save_for_backward(q, gl, E, carry)
        ctx.scale, ctx.box = scale, box
        return entry_forward(q, gl, E, o, scale, carry)

    @staticmethod
    def backward(ctx, dout):
        from .triton.entry import entry_backward, entry_backward_e
        q, gl, E, carry = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        need = ctx.needs_input_grad
        box = ctx.box
        if box is not None:
            dE, db_carry = entry_backward_e(q, gl, E, dout, ctx.scale, carry, need[3], box.need_g)
            box.work = (q, gl, E, dout, ctx.scale, carry, db_carry)
            return dout, None, None, None if dE is None else dE.to(E.dtype), None, None
        dq, dg, dE = entry_backward(q, gl, E, dout, ctx.scale, carry, need[1], need[2], need[3])
        dg = None if dg is None else dg.sum_to_size(gl.shape).to(gl.dtype)
        return dout, dq, dg, None if dE is None else dE.to(E.dtype), None, None


class DeferredGrads:
    """The entry term's dq and dg, carried from its backward to the end of the core's (`defer_entry_grads`).
    Autograd would hold them ([L, H, K] float32 for a vector decay: gigabytes) through the whole backward of the
    core, which runs after the entry term's; here they are added to the core's gradients in place (the dq
    kernel's ACC mode) once the core's backward is done, when its temporaries are gone."""

    def __init__(self, piece, ld, need_q):
        self.piece, self.ld_dim, self.need_q = piece, None if ld is None else ld.dim(), need_q
        self.need_g = ld is not None and ld.requires_grad
        self.work = None

    def finish(self, dq, dld):
        """The core's (dq, dld) with the entry term's added (in place where their layout allows)."""
        from .triton.entry import entry_backward_q
        work, self.work = self.work, None
        if work is None:
            return dq, dld
        q, gl, E, dc, scale, carry, db_carry = work
        a0, b0 = self.piece
        B, L, H = dc.shape[:3]
        need_g = db_carry is not None
        # in place where the core's gradient has the kernel's layout; else into zeros, added below
        dq_t = dq[:, a0:b0] if dq is not None else None
        dq_ok = dq_t is not None and dq_t.is_contiguous() and dq_t.dtype == q.dtype
        dq_buf = dq_t if dq_ok else torch.zeros(B, L, H, q.shape[-1], dtype=q.dtype, device=q.device)
        dg_ok, dg_buf = False, None
        if need_g:
            if dld is not None and self.ld_dim in (3, 4) and dld.dtype == torch.float32:
                dg_t = dld[:, a0:b0] if self.ld_dim == 4 else dld[:, a0:b0].unsqueeze(-1)
                dg_ok = dg_t.is_contiguous() and dg_t.shape[0] == B
            dg_buf = dg_t if dg_ok else torch.zeros(B, L, H, gl.shape[-1], dtype=torch.float32, device=q.device)
        entry_backward_q(q, gl, E, dc, scale, carry, db_carry, dq_buf, dg_buf)
        if self.need_q and not dq_ok and dq is not None:  # (q needs its gradient: the core forms one)
            dq = dq.clone()
            dq[:, a0:b0] += dq_buf
        if need_g and not dg_ok and dld is not None:
            eg = dg_buf.sum_to_size(gl.shape)  # [B|1, L, H, K|1]
            dld = dld.clone()
            if self.ld_dim == 1:
                dld += eg.sum((0, 1, 3)).to(dld.dtype)
            else:
                dld[:, a0:b0] += (eg if self.ld_dim == 4 else eg.squeeze(-1)).to(dld.dtype)
        return dq, dld


class _DeferEntryGrads(torch.autograd.Function):
    """q (and ld) unchanged; the backward hands the core's gradients to the box, which adds the entry term's."""

    @staticmethod
    def forward(ctx, box, q, *ld):
        ctx.box = box
        return (q.view_as(q),) + tuple(x.view_as(x) for x in ld)

    @staticmethod
    def backward(ctx, dq, *dld):
        dq, d = ctx.box.finish(dq, dld[0] if dld else None)
        return (None, dq) + ((d,) if dld else ())


def defer_entry_grads(q, ld, piece):
    """(q, ld, box): views of q and ld to give the core call, and the box to give `add_entry_term`, so that the
    entry term's dq and dg are added to the core's in place after its backward (`DeferredGrads`)."""
    box = DeferredGrads(piece, ld, q.requires_grad)
    if ld is None:
        return _DeferEntryGrads.apply(box, q)[0], None, box
    q, ld = _DeferEntryGrads.apply(box, q, ld)
    return q, ld, box


def entry_runs_triton(q, rd, reverse, backend):
    """Whether the entry term takes its Triton kernels (left decays, forward direction, K <= 256, not float64,
    where the core runs Triton)."""
    return (rd is None and not reverse and q.dtype != torch.float64 and q.shape[-1] <= ENTRY_KERNEL_MAX_K
            and runs_triton(backend, q.device))


ENTRY_KERNEL_MAX_K = 256  # the kernels hold all of K in one tile (ula/core/triton/entry.py)


def add_entry_term(o, q, gl, rd, E, scale, reverse, backend, box=None):
    """o + corr (o [B, L, H, V], the slice's entry piece): the Triton kernels where the core runs them
    (`entry_runs_triton`), the PyTorch form above otherwise. box: from `defer_entry_grads` (Triton only)."""
    if entry_runs_triton(q, rd, reverse, backend):
        if box is not None:
            q, gl = q.detach(), None if gl is None else gl.detach()
        return _EntryTermTriton.apply(o, q, gl, E, float(scale), box)
    assert box is None, "the deferred gradients are for the Triton form"
    return o + entry_term(q, gl, rd, E, scale, reverse).to(o.dtype)
