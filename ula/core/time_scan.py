"""Scans (cumsum, cummax, logcumsumexp) along the time axis of [N, T, ...] tensors, run with time as the last,
contiguous dim: CUDA's scan over an outer dim with few inner elements is nearly sequential (a cumsum over
[1, 131072, 16, 1] took 34 ms on an H200, against ~0.1 ms along the last dim)."""


def scan_time(x, op):
    """op(y): a scan along the last dim of y (e.g. lambda y: y.cumsum(-1)); applied along dim 1 of x."""
    return op(x.movedim(1, -1).contiguous()).movedim(-1, 1)
