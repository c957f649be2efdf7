"""The fused epilogue of normalized linear attention (ula/ops/_normalized_epilogue.py) on a GPU: its errors against
the PyTorch epilogue in float64, then forward+backward medians of the epilogue alone (fused vs PyTorch) and of
normalized_linear_attention end to end (fused vs the PyTorch epilogue, and plain linear attention).

    python3 benchmarks/gpu_normalized_epilogue.py [--shapes 2,8192,16,128;1,65536,16,128]"""
import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import ula  # noqa: E402
import ula.ops.normalized as nmod  # noqa: E402
from ula.ops._normalized_epilogue import normalized_epilogue  # noqa: E402
from compare import rel  # noqa: E402

dev = "cuda"


def check(B, T, H, V, cu=None, a_kind="head", dt=torch.float32, eps=1e-6, den_scale=1.0):
    N = B if cu is None else len(cu) - 1
    cu = None if cu is None else torch.tensor(cu, device=dev)
    x = dict(o=torch.randn(B, T, H, V, device=dev).to(dt), den=torch.randn(B, T, H, device=dev) * den_scale,
             v=torch.randn(B, T, H, V, device=dev).to(dt), z0=torch.randn(N, H, V, device=dev),
             c0=torch.randn(N, H, device=dev))
    a = torch.randn(H, 1, device=dev) if a_kind == "head" else 0.7
    if isinstance(a, torch.Tensor):
        x["a"] = a
    res = {}
    for name, fn, d in (("fused", normalized_epilogue, None), ("ref", nmod._epilogue_torch, torch.float64)):
        lv = {k: t.detach().to(d or t.dtype).requires_grad_() for k, t in x.items()}
        out, (z, c) = fn(lv["o"], lv["den"], lv["v"], lv.get("a", a), lv["z0"], lv["c0"], eps, cu, True)
        res[name] = (lv, out, z, c)
    g = [torch.randn_like(t, dtype=torch.float64) for t in res["ref"][1:]]
    for name in res:
        sum((t.double() * gi).sum() for t, gi in zip(res[name][1:], g)).backward()
    (lf, *of), (lr, *orf) = res["fused"], res["ref"]
    errs = {n: rel(a_, b_) for n, a_, b_ in zip(("out", "Z", "C"), of, orf)}
    errs.update({"d" + k: rel(lf[k].grad, lr[k].grad) for k in lf})
    return errs


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def epilogue_times(B, T, H, V, cu=None, only=None):
    cu = None if cu is None else torch.tensor(cu, device=dev)
    o = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16, requires_grad=True)
    den = (torch.rand(B, T, H, device=dev) + 0.5).requires_grad_()
    v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16, requires_grad=True)
    a = torch.rand(H, 1, device=dev).requires_grad_()
    g = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
    out = {}
    for name, fn in (("fused", normalized_epilogue), ("torch", nmod._epilogue_torch)):
        if only not in (None, name):
            continue

        def fwd():
            return fn(o, den, v, a, None, None, 1e-6, cu, False)[0]

        def fb():
            y = fwd()
            torch.autograd.backward(y, g)
        out[name] = (bench(fwd), bench(fb))
    return out


def end_to_end(B, T, H, D):
    q, k, v = (torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)

    def fb(f):
        return lambda: torch.autograd.backward(f(), g)
    res = {"linear": bench(fb(lambda: ula.linear_attention(q, k, v)[0])),
           "normalized_fused": bench(fb(lambda: ula.normalized_linear_attention(q, k, v)[0]))}
    real = nmod.runs_fused
    nmod.runs_fused = lambda *a: False  # the PyTorch epilogue (and L2 norm) after the Triton core
    try:
        res["normalized_torch_epilogue"] = bench(fb(lambda: ula.normalized_linear_attention(q, k, v)[0]))
    finally:
        nmod.runs_fused = real
    return res


def _kernel_times(fb, iters=5):
    """{kernel name: GPU ms per call of fb} over `iters` profiled calls (after 3 warm-ups)."""
    for _ in range(3):
        fb()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fb()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] = per.get(e.name, 0.0) + e.device_time_total / 1e3 / iters
    return per


def _epilogue_fb(B, T, H, V):
    o = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16, requires_grad=True)
    den = (torch.rand(B, T, H, device=dev) + 0.5).requires_grad_()
    v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16, requires_grad=True)
    a = torch.rand(H, 1, device=dev).requires_grad_()
    g = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)

    def fb():
        o.grad = den.grad = v.grad = a.grad = None
        torch.autograd.backward(normalized_epilogue(o, den, v, a, None, None, 1e-6, None, False)[0], g)
    return fb


def sweep(B, T, H, V):
    """Chunk size, tile elements and warps of the chunk kernels: GPU ms per kernel (profiler), registers and
    spills of each compiled variant."""
    import ula.core.triton.utils as tu
    import ula.ops._normalized_epilogue as epi
    real = tu._launch_fitting
    seen = {}

    def spy(kernel, grid, args, num_warps, constexprs, num_stages=None):
        c = real(kernel, grid, args, num_warps, constexprs, num_stages)
        c = c.result() if hasattr(c, "result") else c
        seen[(kernel.fn.__name__, constexprs.get("BR"), num_warps)] = (c.n_regs, c.n_spills)
        return c
    tu._launch_fitting = spy
    defaults = (epi.CHUNK, epi._FWD, epi._BWD)
    fb = _epilogue_fb(B, T, H, V)
    print(f"epilogue kernels, B{B} T{T} H{H} V{V}, GPU ms per f+b:")
    for C in (64, 128, 256):
        for tile in (2048, 4096, 8192, 16384):
            for w in (4, 8):
                epi.CHUNK, epi._FWD, epi._BWD = C, (tile, w), (tile, w)
                per = _kernel_times(fb)
                ks = {k: v for k, v in per.items() if k.startswith("_")}
                print(f"C {C:3d} tile {tile:5d} warps {w}: " + " ".join(f"{k} {v:.3f}" for k, v in sorted(ks.items()))
                      + f" | all kernels {sum(per.values()):.3f}")
    epi.CHUNK, epi._FWD, epi._BWD = defaults
    tu._launch_fitting = real
    for k, (r, sp) in sorted(seen.items(), key=str):
        print("  regs/spills", k, r, sp)


def sweep_fused(B, T, H, K):
    """The fused op's own small kernels (ula/ops/_normalized_fused.py: the chunk sums of v, the division's backward,
    both at the core's chunk, and the L2 norm's forward) per tile size and warps: GPU ms per f+b (profiler)."""
    import ula.ops._l2norm as l2
    import ula.ops._normalized_epilogue as epi
    r = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16).requires_grad_()  # noqa: E731
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, K)
    g = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)

    def fb():
        q.grad = k.grad = v.grad = None
        torch.autograd.backward(ula.normalized_linear_attention(q, k, v)[0], g)
    defaults = (epi._FWD, epi._BWD, l2._TILE)
    print(f"fused normalized, B{B} T{T} H{H} K=V={K}, GPU ms per f+b:")
    for tile in (2048, 4096, 8192, 16384):
        for w in (4, 8):
            epi._FWD, epi._BWD, l2._TILE = (tile, w), (tile, w), tile
            per = _kernel_times(fb)
            ks = {n: t for n, t in per.items() if n in ("_chunk_sums_kernel", "_backward_kernel", "_l2norm_kernel")}
            print(f"tile {tile:5d} warps {w}: " + " ".join(f"{n} {t:.3f}" for n, t in sorted(ks.items()))
                  + f" | all kernels {sum(per.values()):.3f}")
    epi._FWD, epi._BWD, l2._TILE = defaults


def check_l2():
    import torch.nn.functional as F
    from ula.ops._l2norm import l2_normalize
    for dt in (torch.float32, torch.bfloat16):
        q, k = (torch.randn(2, 4096, 16, 128, device=dev).to(dt) for _ in range(2))
        g = torch.randn(2, 4096, 16, 128, device=dev, dtype=torch.float64)
        res = []
        for fn, d in ((l2_normalize, None), (lambda q, k: (F.normalize(q, dim=-1), F.normalize(k, dim=-1)),
                                             torch.float64)):
            x = [t.detach().to(d or t.dtype).requires_grad_() for t in (q, k)]
            yq, yk = fn(*x)
            ((yq.double() * g).sum() + (yk.double() * g).sum()).backward()
            res.append((yq, yk, x[0].grad, x[1].grad))
        print("check l2", dt, " ".join(f"{n}={rel(a, b):.1e}" for n, a, b in zip(("q", "k", "dq", "dk"), *res)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="2,8192,16,128;1,65536,16,128")
    ap.add_argument("--sweep", action="store_true", help="only the tile sweep and the kernel table (first shape)")
    ap.add_argument("--sweep-fused", action="store_true",
                    help="only the fused op's tile sweep (first shape; its V is also K)")
    a = ap.parse_args()
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)))
    if a.sweep_fused:
        sweep_fused(*(int(x) for x in a.shapes.split(";")[0].split(",")))
        return
    if a.sweep:
        sweep(*(int(x) for x in a.shapes.split(";")[0].split(",")))
        return
    check_l2()
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    worst = 0.0
    for kw in (dict(B=2, T=1000, H=4, V=128), dict(B=2, T=777, H=3, V=48, a_kind="float"),
               dict(B=1, T=3001, H=4, V=128, cu=[0, 1, 300, 1777, 3001]),
               dict(B=2, T=1000, H=4, V=128, dt=torch.bfloat16), dict(B=2, T=500, H=4, V=64, eps=0.3, den_scale=0.01),
               dict(B=1, T=1 << 16, H=2, V=128)):
        e = check(**kw)
        worst = max(worst, max(e.values()))
        print("check", {k: v for k, v in kw.items() if k != "cu"}, "varlen" if "cu" in kw else "",
              " ".join(f"{k}={v:.1e}" for k, v in e.items()))
    print(f"worst relative error {worst:.2e}")
    for s in a.shapes.split(";"):
        B, T, H, V = (int(x) for x in s.split(","))
        t = epilogue_times(B, T, H, V)
        print(f"epilogue {s}: fused fwd {t['fused'][0]:.3f} f+b {t['fused'][1]:.3f} ms | torch fwd "
              f"{t['torch'][0]:.3f} f+b {t['torch'][1]:.3f} ms")
    t = epilogue_times(1, 65536, 16, 128, cu=[0, 1000, 9000, 30000, 30001, 65536])
    print(f"epilogue varlen 1,65536,16,128 (5 seqs): fused f+b {t['fused'][1]:.3f} ms | torch f+b {t['torch'][1]:.3f}")
    for s in a.shapes.split(";"):
        B, T, H, V = (int(x) for x in s.split(","))
        r = end_to_end(B, T, H, V)
        print(f"end to end {s} f+b ms: " + " ".join(f"{k} {v:.3f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
