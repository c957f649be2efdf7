"""Autograd wiring of DESIGN §2: the backward calls the same chunk function F with roles swapped.

    O  = F(Q,  K,  V,  L, R, rev)            dQ = F(dO, V,  K, R, L, rev)   (initial state S0ᵀ)
    dK = F(V,  dO, Q,  R, L, not rev)        dV = F(K,  Q, dO, L, R, not rev)  (enters with dS_T)
The last call's final state is the gradient of the initial state. dO is pre-multiplied by `scale`.
Decay gradients come in closed form (decay_grad.py).
"""
import torch

from .chunk_layout import chunk_bounds
from .decay_grad import border_sums, log_decay_grad


def canonical_left(ld, T):
    """[H] / [B, T, H] / [B, T, H, K] log decay -> broadcastable [B|1, T, H, K|1] (views, no copies)."""
    if ld is None or ld.dim() == 4:
        return ld
    if ld.dim() == 1:
        return ld.view(1, 1, -1, 1).expand(1, T, ld.shape[0], 1)
    return ld.unsqueeze(-1)


def _t(x):
    return None if x is None else x.transpose(-1, -2)


# Log decays are floored at -110 per step: e^-110 is exactly 0 in float32, so in float32 nothing changes,
# except that a larger step no longer inflates the cumulative sums b, whose float32 spacing would blur the
# ordinary differences b_i - b_j after it (a -1e4 step would cost ~1e-3 relative error). The floor's
# gradient is zero, as the true one is (it carries a factor e^{ld}).
LOG_DECAY_FLOOR = -110.0


def floor_decay(g):
    return None if g is None else g.clamp_min(LOG_DECAY_FLOOR)


def half_states(q):
    """Border states that only feed matmuls may be kept in bfloat16 (half the traffic of the largest buffer);
    float16 is not used for them (a long undecayed state can exceed its range)."""
    return torch.bfloat16 if q.dtype == torch.bfloat16 else None


def _floored(F, q, g):
    """g floored, unless F floors log decays itself (a backend's kernels may do it on the way in: no copy)."""
    return g if (getattr(F, "floors_log_decay", False) and q.dtype != torch.float64) else floor_decay(g)


def native_key_gate(F, q, rd):
    """Whether F's kernels apply a log key gate themselves (else k is multiplied by exp(gate) first)."""
    return getattr(F, "fused_backward", None) is not None and rd is None and q.dtype != torch.float64


def gated_keys(k, key_gate, keep_wide=False):
    """exp(key_gate) k (the key gate folded into k: the path of backends without it), in the dtype of k, or in
    float32 (float64 for float64 k) with keep_wide, for a backend that computes in float32 anyway: rounded to
    bfloat16, mLSTMexp's gated keys moved its bf16 outputs 10x further from float64 (3.7e-2) where nᵀq is small."""
    wide = torch.promote_types(k.dtype, torch.float32)
    kg = k.to(wide) * key_gate.to(wide).exp().unsqueeze(-1)
    return kg if keep_wide else kg.to(k.dtype)


def computes_wide(F):
    """Whether F computes in float32 (float64) whatever its inputs' dtype (the PyTorch path): its gated keys then
    stay wide."""
    return getattr(F, "computes_wide", False)


def forward_pass(F, q, k, v, ld, rd, h0, scale, cu_seqlens, reverse, chunk_size, key_gate=None):
    """O = F(Q, K, V, L, R, rev), with k_t entering as exp(key_gate_t) k_t. Returns o (in the dtype of v; in the
    compute dtype with a right decay, whose gradient needs it) and the final state (compute dtype)."""
    kw = {}
    if key_gate is not None:
        if native_key_gate(F, q, rd):
            kw["key_gate"] = key_gate
        else:
            k = gated_keys(k, key_gate, computes_wide(F))
    o, S, _ = F(q, k, v, canonical_left(_floored(F, q, ld), q.shape[1]), _floored(F, q, rd), scale=scale, initial_state=h0,
                cu_seqlens=cu_seqlens, reverse=reverse, chunk_size=chunk_size,
                out_dtype=None if rd is not None else v.dtype, state_dtype=half_states(k), **kw)  # k: GSA's
    # second pass gives q (the softmax output) in float32 beside bfloat16 k, v (ula/ops/gsa.py); its borders stay bf16
    return o, S


def backward_pass(F, q, k, v, ld, rd, h0, o, do, dS, scale, cu, rev, C, need_ld, need_rd, key_gate=None):
    """dQ, dK, dV by the same F with roles swapped, d initial state from the dV pass, decay gradients in
    closed form. o (the forward output in the compute dtype) is needed only for a right decay; dS may be
    None. Returns (dq, dk, dv, dld, drd, dh0, d key_gate) in the dtypes of their inputs (None where not needed).
    A backend may do it all in one function of its own (F.fused_backward, same math) where no right decay is, and
    F.fused_backward_right where a right decay is the only one."""
    if native_key_gate(F, q, rd):
        dq, dk, dv, dld, dh0, du = F.fused_backward(q, k, v, ld, h0, do, dS, scale, cu, rev, C, need_ld, key_gate)
        return dq, dk, dv, dld, None, dh0, du
    if (rd is not None and ld is None and key_gate is None and q.dtype != torch.float64
            and getattr(F, "fused_backward_right", None) is not None):  # a right decay alone (GSA's first pass)
        dq, dk, dv, drd, dh0 = F.fused_backward_right(q, k, v, rd, h0, o, do, dS, scale, cu, rev, C, need_rd)
        return dq, dk, dv, None, drd, dh0, None
    if key_gate is None:
        return _backward_unfused(F, q, k, v, ld, rd, h0, o, do, dS, scale, cu, rev, C, need_ld, need_rd) + (None,)
    # the gate folded into k: k' = e^u k, dk = e^u dk', du = Σ_features k' ⊙ dk'
    kg = gated_keys(k, key_gate, computes_wide(F))
    dq, dkg, dv, dld, drd, dh0 = _backward_unfused(F, q, kg, v, ld, rd, h0, o, do, dS, scale, cu, rev, C, need_ld,
                                                   need_rd)
    wide = torch.promote_types(k.dtype, torch.float32)
    du = (kg.to(wide) * dkg.to(wide)).sum(-1).to(key_gate.dtype)
    dk = (dkg.to(wide) * key_gate.to(wide).exp().unsqueeze(-1)).to(k.dtype)
    return dq, dk, dv, dld, drd, dh0, du


def _backward_unfused(F, q, k, v, ld, rd, h0, o, do, dS, scale, cu, rev, C, need_ld, need_rd):
    T = q.shape[1]
    ld_in, rd_in = ld, rd
    ld, rd = floor_decay(ld), floor_decay(rd)
    gl = canonical_left(ld, T)
    if need_ld or need_rd:
        # decay gradients sum q dq - k dk inside each chunk, and float32 loses digits in proportion
        # to the chunk length: a backend may ask for shorter chunks here (any length gives the same math)
        C = min(C, getattr(F, "decay_grad_chunk", C))
    kw = dict(scale=1.0, cu_seqlens=cu, chunk_size=C)
    # a constant decay's gradient is one sum over all B*T steps of q dq - k dk, terms that cancel: a
    # backend may ask for those two passes in a wider dtype (float64 on the PyTorch path, where float32
    # loses ~1e-5; float32 matmuls on the Triton path, where bfloat16 operands lose ~1e-2)
    wide = getattr(F, "constant_decay_grad_dtype", None) if (need_ld and ld.dim() == 1) else None
    if wide is not None:  # wider only: float64 inputs keep float64 on a backend that asks for float32
        wide = torch.promote_types(wide, q.dtype)
    w = (lambda x: None if x is None else x.to(wide)) if wide is not None else (lambda x: x)  # noqa: E731
    # scaled dO in the dtype of do (its matmul operands are half precision anyway), wider where a pass is
    dos = do.to(wide or (torch.float64 if q.dtype == torch.float64 else do.dtype)) * scale
    half = half_states(q)
    f32 = torch.float32 if q.dtype != torch.float64 else None
    # outputs and border states in float32 where a decay gradient reads them; the border states are kept only
    # for the decay gradients, each pass's other outputs are dropped at once
    decay = need_ld or need_rd
    dq, _, A_q = F(w(dos), w(v), w(k), rd, gl, initial_state=w(_t(h0)), reverse=rev,
                   out_dtype=f32 if need_ld else q.dtype, state_dtype=f32 if decay else half, **kw)
    if not decay:
        A_q = None
    dk = F(w(v), w(dos), w(q), rd, gl, initial_state=w(_t(dS)), reverse=not rev,
           out_dtype=f32 if need_ld else k.dtype, state_dtype=half, **kw)[0]
    dv, dh0, A_v = F(k, q, dos, gl, rd, initial_state=dS, reverse=not rev,
                     out_dtype=f32 if need_rd else v.dtype, state_dtype=f32 if decay else half, **kw)
    del dos
    dld = drd = None
    if need_ld or need_rd:
        # the dQ pass carries the forward states (transposed), the dV pass their gradients
        A, A_rev = (A_v, _t(A_q)) if rev else (_t(A_q), A_v)
        layout = chunk_bounds(T, C, cu, q.device)
        X_left, X_right = border_sums(A, A_rev, gl, rd, layout)
        del A, A_rev, A_q, A_v
        sign = -1.0 if rev else 1.0
        grad_fn = getattr(F, "log_decay_grad", log_decay_grad)
        if need_ld:
            dld = grad_fn(q, dq, k, dk, sign, X_left, layout, ld.shape).to(ld.dtype)
        if need_rd:
            drd = grad_fn(o, do, v, dv, sign, X_right, layout, rd.shape).to(rd.dtype)
    else:
        del A_v
    dh0 = dh0.to(h0.dtype) if h0 is not None else None
    if dld is not None:
        dld = dld * (ld_in > LOG_DECAY_FLOOR)
    if drd is not None:
        drd = drd * (rd_in > LOG_DECAY_FLOOR)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dld, drd, dh0
