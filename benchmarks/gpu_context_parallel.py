"""Context parallelism on 2 GPUs (NCCL): time and peak memory, 1 GPU against 2, plus a 1M-token check.

    OUT=/some/dir torchrun --standalone --nproc_per_node=2 benchmarks/gpu_context_parallel.py [--kinds scalar,vector]

1. T = 262144, B = 1, H = 16, K = V = 128, bfloat16, forward + backward: the whole sequence on one GPU
   (rank 0 alone, cp_group=None) against half of it on each of 2 GPUs (cp_group = the world); median of
   timed repetitions (CUDA events, after a barrier) on every rank, the slowest rank's median the time (before
   session 8 rank 0's was reported), peak memory per GPU (torch.cuda.max_memory_allocated).
2. T = 1048576 on 2 GPUs, forward + backward (time, peak memory, finite gradients), and the output on a
   window across the rank boundary checked against the float64 reference run on that window from the state
   that enters it (computed by a single-GPU no-grad forward over the prefix).
3. --grad-T N: at T = N, every rank's output and gradients against one GPU's on the same bf16 inputs, for the
   --kinds and the --families (gla, mlstm_sig, mlstm_exp: the ops' context-parallel paths, mLSTM's input gate
   the kernels' key gate on each rank's local pass).
Writes $OUT/gpu_context_parallel.json (rank 0); every section records its error instead of stopping.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import traceback

os.environ["NCCL_NVLS_ENABLE"] = "0"  # before any NCCL init: no NVLink multicast on the lent machines
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402

H, K, V = 16, 128, 128


def make(kind, B, T, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, K, device=device, generator=g, dtype=torch.bfloat16)
    k = torch.randn(B, T, H, K, device=device, generator=g, dtype=torch.bfloat16) * K ** -0.5
    v = torch.randn(B, T, H, V, device=device, generator=g, dtype=torch.bfloat16)
    if kind.startswith("mlstm"):  # (i, f) gate pre-activations in the ld slot
        if kind.endswith("_pos"):  # positive q, k: |nᵀq| away from 0, where mLSTMexp's h is well-conditioned
            q, k = q.abs() + 0.1, k.abs() + 0.1 * K ** -0.5
        return q, k, v, (torch.randn(B, T, H, device=device, generator=g) * 2,
                         torch.randn(B, T, H, device=device, generator=g) + 3.0)
    shape = {"none": None, "constant": (H,), "scalar": (B, T, H), "vector": (B, T, H, K), "gla": (B, T, H, K)}[kind]
    ld = None if shape is None else F.logsigmoid(torch.randn(shape, device=device, generator=g) + 4.0)
    return q, k, v, ld


def forward(q, k, v, ld, group, kind="core"):
    """(o, the leaf inputs) of one call of the op `kind` on fresh leaves of the inputs."""
    gates = ld if isinstance(ld, tuple) else (ld,)
    xs = [x.detach().requires_grad_() for x in (q, k, v)] + [None if x is None else x.detach().requires_grad_()
                                                           for x in gates]
    if kind.startswith("mlstm"):
        o, _ = ula.mlstm(*xs, variant=kind.split("_")[1], cp_group=group)
    elif kind == "gla":
        o, _ = ula.gla(*xs, cp_group=group)
    else:
        o, _ = ula.linear_attention(*xs, cp_group=group)
    return o, xs


def fwd_bwd(q, k, v, ld, group, kind="core"):
    o, xs = forward(q, k, v, ld, group, kind)
    o.backward(torch.ones_like(o))
    return o, xs


def rank_slice(kind, T, dev, rank, R):
    """(q, k, v, ld) of `make(kind, 1, T, ...)`, cut to this rank's T / R steps (copies: a view would keep all of T
    alive)."""
    q, k, v, ld = make(kind, 1, T, dev, 0)
    n = T // R
    sl = lambda x: x[:, rank * n:(rank + 1) * n].clone()  # noqa: E731
    cut = (lambda x: sl(x) if x is not None and x.dim() > 1 else x)
    ld = tuple(map(cut, ld)) if isinstance(ld, tuple) else cut(ld)  # mLSTM: the gates (i, f)
    return sl(q), sl(k), sl(v), ld


def timed(fn, reps, group=None):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if group is not None:
            dist.barrier(group)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def section(results, name, fn):
    try:
        results[name] = fn()
    except Exception as e:  # record and go on (the other rank may be waiting at the next barrier)
        results[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="scalar,vector")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--T", type=int, default=262144)
    ap.add_argument("--T_long", type=int, default=1048576, help="the long run's T (0: skip it)")
    ap.add_argument("--families", default="", help="ops for the --grad-T check too (gla,mlstm_sig,mlstm_exp)")
    ap.add_argument("--grad-T", type=int, default=0,
                    help="also compare every rank's output and gradients with one GPU's at this T (0: skip it)")
    args = ap.parse_args()
    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=8))
    rank, R = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    world = dist.group.WORLD
    res = {"world_size": R, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "triton": triton.__version__, "shape": {"B": 1, "H": H, "K": K, "V": V, "dtype": "bfloat16"}, "runs": {}}
    for kind in [x for x in args.kinds.split(",") if x]:
        T = args.T
        # 1 GPU: rank 0 alone on the whole sequence
        if rank == 0:
            def one_gpu():
                q, k, v, ld = make(kind, 1, T, dev, 0)
                torch.cuda.reset_peak_memory_stats(dev)
                ms = timed(lambda: fwd_bwd(q, k, v, ld, None, kind), args.reps)
                return {"T": T, "ms_fwd_bwd": ms, "peak_GiB": torch.cuda.max_memory_allocated(dev) / 2**30}
            section(res["runs"], f"{kind}/1gpu/T={T}", one_gpu)
        dist.barrier()

        def cp(Tt):
            def run():
                q, k, v, ld = make(kind, 1, Tt, dev, 0)  # the same full inputs on every rank, then the slice
                n = Tt // R
                s, e = rank * n, (rank + 1) * n if rank < R - 1 else Tt
                # clones: with B = 1 a slice along T is already contiguous, and .contiguous() would return the view,
                # keeping the whole sequence's inputs alive on every rank (session 7 measured them in the peak)
                q, k, v = q[:, s:e].clone(), k[:, s:e].clone(), v[:, s:e].clone()
                cut = (lambda x: x[:, s:e].clone() if x is not None and x.dim() > 1 else x)
                ld = tuple(map(cut, ld)) if isinstance(ld, tuple) else cut(ld)
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
                ms = timed(lambda: fwd_bwd(q, k, v, ld, world, kind), args.reps, world)
                peak = torch.cuda.max_memory_allocated(dev) / 2**30
                peaks, mss = [None] * R, [None] * R
                dist.all_gather_object(peaks, peak)
                dist.all_gather_object(mss, ms)
                # a step takes as long as its slowest rank (the next step's collectives wait for it)
                out = {"T": Tt, "ms_fwd_bwd": max(mss), "ms_fwd_bwd_per_rank": mss, "peak_GiB_per_gpu": peaks}
                if Tt == args.T_long:
                    out.update(check_long(kind, Tt, q, k, v, ld, s, dev, rank, R))
                return out
            return run
        section(res["runs"], f"{kind}/{R}gpu/T={T}", cp(T))
        dist.barrier()
        if args.T_long > 0:  # 0: skip the long run
            section(res["runs"], f"{kind}/{R}gpu/T={args.T_long}", cp(args.T_long))
            dist.barrier()
    if args.grad_T > 0:
        for kind in [x for x in args.kinds.split(",") + args.families.split(",") if x]:
            section(res["runs"], f"{kind}/{R}gpu/grads/T={args.grad_T}",
                    lambda: check_grads(kind, args.grad_T, dev, rank, R, world))
            dist.barrier()
    if rank == 0:
        out = os.environ.get("OUT", ".")
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "gpu_context_parallel.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps(res, indent=1))
    dist.destroy_process_group()


def check_grads(kind, T, dev, rank, R, world):
    """This rank's slice of o and of every gradient from the CP call against the same rows of one GPU's call on
    the whole sequence (the same bfloat16 inputs on every rank), relative errors in float32; every rank. Also both
    against one GPU's float32 call on the same inputs: where the bf16 result is ill-conditioned (mLSTMexp with
    |nᵀq| near 0) two bf16 computations differ by more than either misses float32 by."""
    q, k, v, ld = make(kind, 1, T, dev, 0)
    o1, xs1 = fwd_bwd(q, k, v, ld, None, kind)
    wide = (lambda x: x.float() if x is not None and x.dtype == torch.bfloat16 else x)
    o32, xs32 = fwd_bwd(wide(q), wide(k), wide(v), ld, None, kind)
    n = T // R
    s, e = rank * n, (rank + 1) * n if rank < R - 1 else T
    cut = (lambda x: x[:, s:e].clone() if x is not None and x.dim() > 1 else x)
    ldc = tuple(map(cut, ld)) if isinstance(ld, tuple) else cut(ld)
    oc, xsc = fwd_bwd(cut(q), cut(k), cut(v), ldc, world, kind)
    errs, vs32, one_vs32 = {}, {}, {}
    names = ("q", "k", "v", "i", "f") if kind.startswith("mlstm") else "qkvg"

    def rel(a, b):
        b = b[:, s:e] if b.dim() > 1 else b
        return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
    for name, a, b, b32 in [("o", oc, o1, o32)] + [("d" + nm, x.grad, y.grad, z.grad) for nm, x, y, z in
                                                   zip(names, xsc, xs1, xs32) if x is not None]:
        errs[name], vs32[name] = rel(a, b), rel(a, b32)
        one_vs32[name] = rel(b[:, s:e] if b.dim() > 1 else b, b32)
    per_rank = [None] * R
    dist.all_gather_object(per_rank, (errs, vs32, one_vs32))
    # bf16 on 2 GPUs as close to float32 as bf16 on one GPU (2x, or 2e-2 / 4e-2 for the gates' gradients)
    ok = all(v32[n] < max(2 * v1[n], 4e-2 if n in ("dg", "di", "df") else 2e-2)
             for _, v32, v1 in per_rank for n in v32)
    return {"T": T, "rel_err_vs_one_gpu_per_rank": [r[0] for r in per_rank],
            "rel_err_vs_one_gpu_float32_per_rank": [r[1] for r in per_rank],
            "one_gpu_bf16_rel_err_vs_float32_per_rank_rows": [r[2] for r in per_rank], "ok": ok}


def check_long(kind, T, q, k, v, ld, s, dev, rank, R, W=256):
    """Gradients finite; and the output on a window [T/R - W, T/R + W) (across the first rank boundary)
    against the float64 reference on the window, from the state entering it (single-GPU prefix forward)."""
    o, xs = fwd_bwd(q, k, v, ld, dist.group.WORLD)
    finite = all(bool(torch.isfinite(x.grad).all()) for x in xs if x is not None)
    finite_all = [None] * R
    dist.all_gather_object(finite_all, finite)
    # the window's rows of the CP output, from the ranks that hold them
    b = T // R
    w0, w1 = b - W, b + W
    mine = o.detach().float()[:, max(w0, s) - s:max(min(w1, s + o.shape[1]) - s, 0)].cpu()
    parts = [None] * R
    dist.all_gather_object(parts, (s, mine))
    result = {"grads_finite_per_rank": finite_all}
    if rank == 0:
        got = torch.cat([p for st, p in sorted(parts, key=lambda x: x[0]) if p.shape[1] > 0], 1)
        qf, kf, vf, ldf = make(kind, 1, T, dev, 0)
        with torch.no_grad():
            _, S = ula.linear_attention(qf[:, :w0], kf[:, :w0], vf[:, :w0],
                                        ldf[:, :w0] if ldf is not None and ldf.dim() > 1 else ldf,
                                        output_final_state=True)
        sl = (lambda x: None if x is None else (x[:, w0:w1] if x.dim() > 1 else x))
        o_ref, _ = ula.reference_linear_attention(sl(qf), sl(kf), sl(vf), sl(ldf), initial_state=S.cpu())
        err = ((got.double() - o_ref).norm() / o_ref.norm()).item()
        result.update({"window": [w0, w1], "rel_err_vs_reference": err, "ok": err < 2e-2 and all(finite_all)})
        del qf, kf, vf, ldf
    return result


if __name__ == "__main__":
    main()
