"""The backward of DESIGN §2 on the Triton kernels, with the work the three passes share done once.

    dQ = F(dO, V, K, R, L, rev)    dK = F(V, dO, Q, R, L, not rev)    dV = F(K, Q, dO, L, R, not rev)

The dK and dV passes carry the same states (Σ qᵀ dO, transposed), and the dQ pass carries the forward's states
(Σ kᵀ v, transposed): so one state kernel per direction, and the output kernel reads them transposed in place.
Two cumulative sums (one per direction) serve all five kernels. dO enters unscaled: the state kernel and the
output kernel's intra-chunk part take `scale`. The log-decay gradient's terms are formed by the output kernels
of dq and dk (from their float32 results) and at the chunk borders by the second state kernel (from the two
states that meet there), so neither dq nor dk is kept in float32 and no border product is materialized.

A log key gate u (k_t enters as e^{u_t} k_t, mLSTM's input gate) is applied where k is read: on the source steps
of the forward-role states and of the dQ pass, on the output rows of the dK and dV passes (their rows are key
steps); its gradient, Σ_features k ⊙ dk per step, is formed by the dK pass's output kernel.

fused_backward: a left decay only (any kind). fused_backward_right: a right decay only (GSA's first pass), the
same passes with the sides swapped. Both decays together take the generic path of ula/core/autograd.py."""
from typing import NamedTuple

import torch

from ..autograd import LOG_DECAY_FLOOR, canonical_left
from ..chunk_layout import make_layout
from .chunk import _final_decay
from .cumsum import chunk_cumsum
from .decay_grad import decay_grad_from_terms
from .output import chunk_output
from .state import chunk_states
from .state_join import add_entering_column
from .utils import DOT_F32, border_dtype, dot_code, part_dot, state_dot


def _bounds(layout, C):
    """(starts, ends) of every chunk for varlen layouts; None when chunks are [i C, (i + 1) C) of each row."""
    if not layout.varlen:
        return None
    ends = torch.minimum(layout.chunk_start + C, layout.cu[1:][layout.chunk_seq.long()])
    return layout.chunk_start, ends.to(torch.int32).contiguous()


class _Setup(NamedTuple):
    """What both backwards prepare alike (_setup)."""
    layout: object
    fwd: object   # chunk-local cumulative sums of the decay, the forward's direction (None: no decay)
    bwd: object   # and the state gradients' direction
    dot: int      # the inputs' matmul code
    sdot: int     # the states path's
    half: object  # border states' dtype where only matmuls read them
    h0f: object   # h0 and dS in float32 (None where not given)
    dSf: object


def _setup(q, k, v, do, decay, h0, dS, cu_seqlens, rev, C, f32_states=False):
    """(q, k, v, do made contiguous, _Setup); decay the one decay (left or right, or None), not floored: the
    cumulative sums floor it on the way in. f32_states: float32 matmuls on the states path."""
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    B, T = q.shape[:2]
    layout = make_layout(B, T, C, cu_seqlens, q.device)
    fwd = chunk_cumsum(decay, layout, rev) if decay is not None else None
    bwd = chunk_cumsum(decay, layout, not rev) if decay is not None else None
    dot = dot_code(q, k, v, do)
    sdot = state_dot(DOT_F32 if f32_states else dot)  # tf32 with precision part wide_states
    f32 = torch.float32
    # border states in bfloat16 where only matmuls read them (the callers take float32 where the decay gradient does)
    half = border_dtype(k, sdot)  # k, not q: q may be float32 beside bfloat16 k, v (GSA's second pass)
    h0f = h0.to(f32).contiguous() if h0 is not None else None
    dSf = dS.to(f32).contiguous() if dS is not None else None
    return q, k, v, do, _Setup(layout, fwd, bwd, dot, sdot, half, h0f, dSf)


def _through_first_step(x, decay, right, rev, cu_seqlens):
    """x, a state gradient, carried through the first step's (floored) decay where the state gradients ran in
    reverse (a forward pass with a decay); decay on the right side of the states where right."""
    if rev or decay is None:
        return x
    return _final_decay(x, None if right else decay, decay if right else None, cu_seqlens, floor=LOG_DECAY_FLOOR)


def fused_backward(q, k, v, ld, h0, do, dS, scale, cu_seqlens, rev, C, need_ld, key_gate=None, ones=None,
                   dv_rank_one=None, project=None, do_weight=None, q_raw=None):
    """(dq, dk, dv, dld, dh0, d key_gate) of o = F(q, k, v, ld, None, rev) for the gradient do of o and dS of
    the final state (None: zero); ld as the caller gave it ([H], [B, T, H], [B, T, H, K] or None), not floored.
    ones = (dden, n0, dn, fwd): v has one more column of ones, held apart (ula/core/ones.py): dden [B, T, H] the
    gradient of its output column, n0 / dn [N, H, K] its part of the initial state and of the final state's
    gradient, fwd = (n_border [B, H, n, K] float32, its borders as the forward's state call returned them, delta:
    None where that call started from n0, else n0 less its initial column, [N, H, K]) (each may be None; without
    fwd the forward's states are summed again with their column); then dn0 comes last. Forward direction, decays
    with one value per step: the column enters the dQ and dK passes as a rank-one term of their scores and an extra
    vector of their states.
    dv_rank_one = (e [B, T, H], n_border [B * chunks, H, V]) float32: q has one more feature, e, against a constant
    1 in k (normalized attention's a part): dv gets Σ_{i>=j in the chunk} e_i do_i (times scale) plus n_border, the
    rest of that sum from the later chunks (and the final state's gradient), which the caller forms (no decay).
    project = (rq, rk) [B, T, H] float32: q and k are L2-normalized inputs, r = ±1 / |x| per row
    (utils.signed_inverse); dq and dk are returned as the gradients of the inputs before the norm (the dQ
    and dK passes form them, K in one tile).
    q_raw = (wq, eq, edv or None) [B, T, H] float32 (with project, do_weight and ones): q is given before its norm
    (the forward's output kernel normalized it, chunk_output's qnorm), so where its rows serve as keys or values (the
    state call, the dK and dV passes) they take weights with |rq| in them: wq = do_weight |rq| for do_weight, eq =
    dden |rq| for ones' column, edv = dv_rank_one's e / |rq| (ula/ops/_normalized_epilogue.backward_from_output).
    do_weight [B, T, H] float32: the gradient of o is do_t times do_weight_t, formed where the kernels read do (the
    backward of normalized attention's division, 1 / d: no [B, T, H, V] dnum = dout / d written and read back);
    ones' dden is not weighted."""
    T = q.shape[1]
    gl = canonical_left(ld, T)
    vec = gl is not None and gl.shape[-1] > 1
    # a constant decay's gradient is one sum over all B*T steps of q dq - k dk, terms that cancel: float32
    # matmuls for everything it reads (bfloat16 operands lose ~1e-2 there, seen on an H100)
    wide = need_ld and ld.dim() == 1
    q, k, v, do, (layout, b_fwd, b_bwd, dot, sdot, half, h0f, dSf) = _setup(q, k, v, do, gl, h0, dS, cu_seqlens,
                                                                            rev, C, f32_states=wide)
    dot_w = DOT_F32 if wide else dot
    f32 = torch.float32
    u = key_gate.contiguous() if key_gate is not None else None
    on = ones is not None
    e = n0f = dnf = None
    if on:
        assert not rev and not vec
        dden, n0, dn, fwd = ones
        e = (dden.float() if dden is not None else q.new_zeros(q.shape[:3], dtype=f32)).contiguous()
        if h0f is not None:
            n0f = n0.to(f32).contiguous() if n0 is not None else h0f.new_zeros(h0f.shape[:-1])
        if dSf is None and dn is not None:
            dSf = dn.new_zeros((*dn.shape, v.shape[-1]), dtype=f32)
        if dSf is not None:
            dnf = dn.to(f32).contiguous() if dn is not None else dSf.new_zeros(dSf.shape[:-1])

    # the state gradients (the dK and dV passes' states, one kernel): Σ qᵀ (scale dO), entering with dS
    # precision part states_backward: both state kernels' matmuls in tf32, border states still in their dtypes
    sdot_t = sdot if wide else part_dot("states_backward", dot, sdot)
    wd = None if do_weight is None else do_weight.contiguous()
    # q given before its norm: as keys (state call, dK pass) and values (dV pass) its rows times |rq|, the
    # normalized rows; the dQ pass's terms do not hold q
    wq, eq = wd, e
    if q_raw is not None:
        assert wd is not None and on and project is not None
        wq, eq = q_raw[0], q_raw[1]
    g = chunk_states(q, do, b_bwd, None, dSf, layout, not rev, sdot_t, f32 if need_ld else half, scale=scale,
                     ones=on, n0=dnf, e=eq, w=wq)
    g_border, dh0 = g[0], g[1]
    g_n, dn0 = g[3] if on else (None, None)
    del g  # the tuple would keep g_border alive past its `del` below (one border-sized buffer at the peak)
    # the forward's states (the dQ pass's), and the decay gradient's border terms against the state gradients
    # the column's borders from the forward where given: not summed again (only their border terms need them)
    n_fwd = None
    if on and fwd is not None:
        n_fwd = fwd[0]
        if fwd[1] is not None:  # a copy: the forward's tensor is saved for a backward that may run again
            n_fwd = add_entering_column(n_fwd.to(f32, copy=True), b_fwd, layout, fwd[1])
    resum = on and n_fwd is None
    f = chunk_states(k, v, b_fwd, None, h0f, layout, rev, sdot_t, f32 if wide else half,
                     partner=g_border if need_ld else None, gate=u, ones=resum, n0=n0f if resum else None,
                     partner_n=g_n if need_ld else None, n_given=n_fwd if need_ld else None)
    f_border, X = f[0], f[2]
    f_n = f[3][0] if resum else n_fwd
    del f
    # a right decay in the dQ and dK passes; one value per step commutes and is carried on the left
    left_q, right_q = (None, b_fwd) if vec else (b_fwd, None)
    left_k, right_k = (None, b_bwd) if vec else (b_bwd, None)
    # forward-direction passes read their initial state through the output kernel (transposed like the states)
    dq_out = chunk_output(do, v, k, left_q, right_q, f_border, h0f if not rev else None, scale, layout, rev, dot_w,
                          q.dtype, state_transposed=True, gate=u, dg=(q, None, 1.0, vec) if need_ld else None,
                          rank_one=(1, e, f_n, n0f) if on else None, state_dot=sdot,
                          project=None if project is None else (q, project[0], q_raw is not None),
                          weight=None if wd is None else (1, wd))
    dq, db = (dq_out[0], dq_out[1]) if need_ld else (dq_out, None)
    del f_border
    extras = need_ld or u is not None
    dk_out = chunk_output(v, do, q, left_k, right_k, g_border, dSf if rev else None, 1.0, layout, not rev, dot_w,
                          k.dtype, scale_intra=scale, state_transposed=True, gate=u, gate_rows=True,
                          dg=(k, db, -1.0, vec) if need_ld else None, du_of=k if u is not None else None,
                          rank_one=(2, eq, g_n, None) if on else None, state_dot=sdot,
                          project=None if project is None else (k, project[1]),
                          weight=None if wd is None else (2, wq))
    dk, du = (dk_out[0], dk_out[2]) if extras else (dk_out, None)
    r1v = None
    if dv_rank_one is not None:
        assert gl is None and not rev
        # with q_raw the weight |rq| / d covers the rank-one term too: its e per step divided by |rq|
        r1v = (2, dv_rank_one[0] if q_raw is None else q_raw[2], dv_rank_one[1], None, True)
    dv = chunk_output(k, q, do, b_bwd, None, g_border, dSf if rev else None, 1.0, layout, not rev, dot, v.dtype,
                      scale_intra=scale, gate=u, gate_rows=True, state_dot=state_dot(dot), rank_one=r1v,
                      weight=None if wd is None else (3, wq))
    del g_border
    if h0 is not None:
        dh0 = _through_first_step(dh0, gl, False, rev, cu_seqlens).to(h0.dtype)
        if on:
            dn0 = _through_first_step(dn0.unsqueeze(-1), gl, False, rev, cu_seqlens).squeeze(-1)
    else:
        dh0 = dn0 = None
    dld = None
    if need_ld:
        db = db.unsqueeze(0) if vec else db.unsqueeze(-1)  # [B, T, H, K] per feature, else [V tiles, B, T, H]
        dld = decay_grad_from_terms(db, X, -1.0 if rev else 1.0, ld.shape, T, C, layout.n,
                                    bounds=_bounds(layout, C), g_mask=gl, floor=LOG_DECAY_FLOOR)
        if ld.dim() == 1:
            dld = dld * (ld > LOG_DECAY_FLOOR)
        dld = dld.to(ld.dtype)
    if du is not None:
        du = (du[0] if du.shape[0] == 1 else du.sum(0)).to(key_gate.dtype)
    if on:
        return dq, dk, dv, dld, dh0, du, dn0
    return dq, dk, dv, dld, dh0, du


def fused_backward_right(q, k, v, rd, h0, o, do, dS, scale, cu_seqlens, rev, C, need_rd):
    """(dq, dk, dv, drd, dh0) of o = F(q, k, v, None, rd, rev): a right decay alone ([B, T, H, V], GSA's first
    pass), o the forward's output. fused_backward with the two sides swapped: the decay sits on the V side of the
    states, so it is the left decay (per feature, over their contraction V) of the dQ and dK passes and the right
    decay of the dV pass. Its gradient's per-step terms o ⊙ do − v ⊙ dv: o ⊙ do formed once, v ⊙ dv added by the
    dV pass's output kernel; its border terms, summed over K, by the forward state kernel."""
    T = q.shape[1]
    q, k, v, do, (layout, c_fwd, c_bwd, dot, sdot, half, h0f, dSf) = _setup(q, k, v, do, rd, h0, dS, cu_seqlens,
                                                                            rev, C)
    f32 = torch.float32
    g = chunk_states(q, do, None, c_bwd, dSf, layout, not rev, sdot, f32 if need_rd else half, scale=scale)
    g_border, dh0 = g[0], g[1]
    del g
    f = chunk_states(k, v, None, c_fwd, h0f, layout, rev, sdot, half, partner=g_border if need_rd else None,
                     partner_right=True)
    f_border, X = f[0], f[2]
    del f
    dq = chunk_output(do, v, k, c_fwd, None, f_border, h0f if not rev else None, scale, layout, rev, dot, q.dtype,
                      state_transposed=True, state_dot=sdot)
    del f_border
    dk = chunk_output(v, do, q, c_bwd, None, g_border, dSf if rev else None, 1.0, layout, not rev, dot, k.dtype,
                      scale_intra=scale, state_transposed=True, state_dot=sdot)
    dg = None
    if need_rd:
        # o is float32 (the forward keeps it so for a right decay): one kernel, do promoted on the way
        dg = (v, ((o if o.dtype == f32 else o.float()) * do).contiguous(), -1.0, True)
    dv_out = chunk_output(k, q, do, None, c_bwd, g_border, dSf if rev else None, 1.0, layout, not rev, dot, v.dtype,
                          scale_intra=scale, dg=dg, state_dot=sdot)
    del g_border
    dv, db = (dv_out[0], dv_out[1]) if need_rd else (dv_out, None)
    dh0 = _through_first_step(dh0, rd, True, rev, cu_seqlens).to(h0.dtype) if h0 is not None else None
    drd = None
    if need_rd:
        drd = decay_grad_from_terms(db.unsqueeze(0), X, -1.0 if rev else 1.0, rd.shape, T, C, layout.n,
                                    bounds=_bounds(layout, C), g_mask=rd, floor=LOG_DECAY_FLOOR).to(rd.dtype)
    return dq, dk, dv, drd, dh0
