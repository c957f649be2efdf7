"""Closed-form gradients of the log decays (DESIGN §2, paper 002 §4.3), chunk-local for accuracy.

With b the cumulative left log decay, the loss depends on b only through q e^{±b} and k e^{∓b}:
    db_t = ±(q_t ⊙ dq_t − k_t ⊙ dk_t)      (+ forward, − reverse),   d ld_u = Σ_{t ≥ u} db_t.
Summed over the whole sequence that reverse cumsum cancels terms that grow with position, and float32
loses digits in proportion to T. So it is summed only inside u's chunk, and every pair of steps that
crosses the chunk's right border is added at once from the two states that meet there:
    X_n = Σ_v  A_n ⊙ e^{ld_next} ⊙ Ã_n ⊙ e^{rd_next}
A_n: state of the forward-running recurrence after chunk n, Ã_n: state of the reverse-running one
entering chunk n from the right, ld_next / rd_next: decay of the step after the chunk (0 at the end of a
sequence, where A and Ã are the final state and its gradient, or the gradient of the initial state and
the initial state). The right decay is the same with (o, do, v, dv) and the sum over K.
"""
import torch


def border_sums(A, A_rev, gl, gr, layout):
    """X for the left decay [B, H, n, K] (sum over V) and the right decay [B, H, n, V] (sum over K) of
    A ⊙ Ã with the decays of the step after each chunk: X_left = λ ⊙ ((A ⊙ Ã) γ), X_right = γ ⊙ (λ (A ⊙ Ã))."""
    ends, inner = layout.ends, layout.inner
    nxt = torch.where(inner, ends, torch.zeros_like(ends)).long()
    P = A * A_rev  # [B, H, n, K, V]

    def step_after(g):  # decay of the step after each chunk, 1 at the end of a sequence: [B|1, H, n, D]
        if g is None:
            return None
        return (g[:, nxt].to(P.dtype) * inner.view(1, -1, 1, 1)).exp().transpose(1, 2)

    lam, gam = step_after(gl), step_after(gr)
    x_left = P.sum(-1) if gam is None else (P @ gam.unsqueeze(-1)).squeeze(-1)
    if lam is None:
        x_right = P.sum(-2)
    elif lam.shape[-1] == 1:  # the same decay for every feature
        x_left, x_right = x_left * lam, P.sum(-2) * lam
    else:
        x_left, x_right = x_left * lam, (lam.unsqueeze(-2) @ P).squeeze(-2)
    if gam is not None:
        x_right = x_right * gam
    return x_left, x_right


def log_decay_grad(a, da, x, dx, sign, X, layout, shape):
    """Gradient of a log decay on the side of `a` (query) and `x` (key).

    a, da, x, dx: [B, T, H, D]; X: border sums [B, H, n, D]; shape: the decay's own shape
    ([H], [B, T, H] or [B, T, H, D])."""
    ends = layout.ends.long()
    db = sign * (a.double() * da.double() - x.double() * dx.double())
    db[:, ends - 1] += X.transpose(1, 2)
    # reverse cumsum restarting at every chunk: global reverse cumsum (float64) minus its value past the chunk
    r = db.flip(1).cumsum(1).flip(1)
    r = torch.cat([r, torch.zeros_like(r[:, :1])], 1)
    T = db.shape[1]
    chunk_of = torch.searchsorted(ends, torch.arange(T, device=db.device), right=True)
    d = r[:, :T] - r[:, ends[chunk_of]]
    if len(shape) == 4:
        return d
    if len(shape) == 3:
        return d.sum(-1)
    return d.sum((0, 1, 3))
