"""Timing and memory of one op, forward and forward+backward, shared by `ula bench` and
benchmarks/gpu_core_vs_peers.py.

GPU: median ms by `triton.testing.do_bench` (warm-up 25, rep 100), peak memory of one forward+backward
above what the inputs hold (`torch.cuda.max_memory_allocated`). CPU: median of `reps` wall-clock runs,
no memory figure (None)."""
import statistics
import time

import torch
import torch.nn.functional as F

import ula


def _leaves(args):
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def measure(fn, args):
    """(fwd ms, fwd+bwd ms, peak MiB of fwd+bwd above what the inputs hold) on CUDA."""
    import triton
    with torch.no_grad():
        fn(*args)
    t_f = triton.testing.do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode="median")
    o = fn(*args)
    do = torch.randn_like(o)
    leaves = _leaves(args)

    def fb():
        fn(*args).backward(do)

    for a in leaves:  # a caller's gradients are left as they were, not added to (a caller may hold them)
        a.grad = None
    fb()
    t_fb = triton.testing.do_bench(fb, warmup=25, rep=100, return_mode="median", grad_to_none=leaves)
    for a in leaves:
        a.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fb()
    torch.cuda.synchronize()
    return t_f, t_fb, (torch.cuda.max_memory_allocated() - base) / 2**20


def replay_ms(fn, rep=100):
    """Median ms of CUDA-graph replays of fn(), warmed up on a side stream first (as capture wants); the graph and
    its memory pool are released after."""
    import triton
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    try:
        return triton.testing.do_bench(g.replay, warmup=25, rep=rep, return_mode="median")
    finally:
        del g
        torch.cuda.empty_cache()


def graph_times(fn, args):
    """(fwd ms, fwd+bwd ms) as medians of CUDA-graph replays of fn(*args) and of its forward+backward: the GPU's
    time without the host's (Python, launches), which eager timing of a short op measures instead (METHOD.md: for
    many small launches, time a graph's replays). Raises what the capture raises (an op that waits for the host)."""
    leaves = _leaves(args)
    do = torch.randn_like(fn(*args))

    def fwd():
        with torch.no_grad():
            fn(*args)

    def fb():  # gradients cleared first: captured, they land in the graph's own buffers, rewritten by every replay
        for a in leaves:
            a.grad = None
        fn(*args).backward(do)

    try:
        return replay_ms(fwd), replay_ms(fb)
    finally:
        for a in leaves:
            a.grad = None


def measure_cpu(fn, args, reps=5):
    """(fwd ms, fwd+bwd ms, None): medians of reps runs after one warm-up each."""
    leaves = _leaves(args)

    def timed(f):
        f()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append((time.perf_counter() - t0) * 1e3)
            for a in leaves:
                a.grad = None
        return statistics.median(ts)

    with torch.no_grad():
        t_f = timed(lambda: fn(*args))
    o = fn(*args)
    do = torch.randn_like(o)
    t_fb = timed(lambda: fn(*args).backward(do))
    return t_f, t_fb, None


def measure_on(device, fn, args, reps=5):
    return measure(fn, args) if torch.device(device).type == "cuda" else measure_cpu(fn, args, reps)


def ours(kind, B, T, H, K, V, C=None, device="cuda", dtype=torch.bfloat16):
    """(fn, args) of ula.linear_attention for a decay kind: none, constant, scalar (mLSTMsig: input gate σ(ĩ) on
    k as the key gate, forget gate as the scalar log decay) or vector (GLA)."""
    dev, dt = device, dtype
    r = lambda *s, sc=1.0: (torch.randn(*s, device=dev, dtype=dt) * sc).requires_grad_()  # noqa: E731
    q, k, v = r(B, T, H, K, sc=K ** -0.5), r(B, T, H, K, sc=K ** -0.5), r(B, T, H, V)
    if kind == "none":
        return (lambda q, k, v: ula.linear_attention(q, k, v, chunk_size=C)[0]), [q, k, v]
    if kind == "constant":
        g = (-torch.arange(1, H + 1, device=dev, dtype=torch.float32) / H)
        return (lambda q, k, v: ula.linear_attention(q, k, v, g, chunk_size=C)[0]), [q, k, v]
    if kind == "scalar":
        i = (torch.randn(B, T, H, device=dev, dtype=dt) - 2).requires_grad_()
        f = (torch.randn(B, T, H, device=dev, dtype=dt) + 4).requires_grad_()
        return (lambda q, k, v, i, f: ula.linear_attention(q, k, v, F.logsigmoid(f.float()), chunk_size=C,
                                                           key_gate=F.logsigmoid(i.float()))[0]), [q, k, v, i, f]
    if kind == "vector":
        g = F.logsigmoid(torch.randn(B, T, H, K, device=dev, dtype=torch.float32) + 4).requires_grad_()
        return (lambda q, k, v, g: ula.linear_attention(q, k, v, g, chunk_size=C)[0]), [q, k, v, g]
    raise ValueError(f"kind must be none, constant, scalar or vector, got {kind!r}")


def forward_backward(fn, args, warm=3):
    """A closure running one forward+backward of fn(*args) against a fixed random output gradient (the leaves'
    gradients cleared first), already run `warm` times (compiled, allocator warm)."""
    do = torch.randn_like(fn(*args))
    leaves = _leaves(args)

    def fb():
        for x in leaves:
            x.grad = None
        fn(*args).backward(do)

    for _ in range(warm):
        fb()
    return fb
