"""Hardening on the GPU (issue 8, items 3, 4 and 6), one run, bfloat16.

    python3 benchmarks/gpu_hardening.py [--quick] [--cpu-smoke] [--sections big,long,determinism,quality]
    bash benchmarks/gpu_sanitizer.sh      # item 3's out-of-bounds check (compute-sanitizer memcheck)

big          ula.linear_attention with tensors of more than 2^31 elements (default: no decay at
             B=1 T=2^20+2^15 H=16 K=V=128, and vector decay at B=1 T=2^20+2^15 H=32 K=V=64: q alone holds
             2.2e9 elements, and the element offsets of every token past t = 2^20 are above 2^31), forward and
             backward (forward only, recorded, when forward+backward runs out of memory). Reference: per
             sampled head, ula's PyTorch chunk path in float64 on that head alone (heads are independent: its
             output and gradients are exactly that head's slice), inputs as rounded to bf16. Relative error
             (Frobenius) over the whole head and over time windows (the start, the middle, the window around
             t = 2^20, the end).
long         T = 2^20 for every decay kind (none, constant, scalar, vector) on one head (B=1 H=1 K=V=128),
             forward, final state and backward, against the same float64 reference, whole and windowed.
determinism  every public op (ula.linear_attention for each decay kind with an initial state, varlen, the
             families gla, mlstm sig / exp, gsa, normalized, and the conveniences) twice on the same inputs:
             are the outputs and every gradient bitwise equal?
quality      bf16 relative error against a float64 reference (ula's PyTorch path in float64 on the same
             bf16-rounded inputs) of the output and every gradient, ours and fla's, for the ops both have:
             linear attention (no decay), constant decay (fla chunk_simple_gla g_gamma, no gradient for it
             there), scalar decay (chunk_simple_gla g), GLA (chunk_gla), normalized (chunk_linear_attn
             normalize=True; ours with a=0, b=1, no L2 norm, positive q, k) and GSA (chunk_gsa; only with
             --fla-gsa: its autotuning alone takes ~400 s).
Limits: 1e-2 relative for outputs, states and q/k/v gradients, 2e-2 for log-decay gradients (as in
benchmarks/gpu_check_triton.py). Writes $OUT/gpu_hardening.json."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import ula  # noqa: E402
from ula.bench import families as fam  # noqa: E402
from ula.bench.script import Run, free_memory, is_oom  # noqa: E402
from compare import rel  # noqa: E402

TOL, TOL_DECAY = 1e-2, 2e-2
DECAY_GRADS = ("dld", "dg", "df", "di", "ds", "dw", "ddt", "dA")
BIG = {"none": (1, 2**20 + 2**15, 16, 128, 128), "vector": (1, 2**20 + 2**15, 32, 64, 64)}
Q_OPS = tuple(o for o in fam.FLA_SHARED if o not in ("gsa", "abc_fla_form"))  # (slow first calls in fla)
DET_OPS = fam.CORE_KINDS + ("vector_varlen",) + fam.FAMILIES[:-1] + fam.CONVENIENCES


def add_args(ap):
    ap.add_argument("--sections", default="big,long,determinism,quality")
    ap.add_argument("--big-kinds", default=None, help="decay kinds of the >2^31 test (default none,vector; quick none)")
    ap.add_argument("--big-shapes", default=None,
                    help="B,T,H,K,V per kind, e.g. 'none=1,1081344,16,128,128;vector=1,1081344,32,64,64' (the default)")
    ap.add_argument("--big-heads", default=None, help="sampled heads (default 0,middle,last; quick 0,last)")
    ap.add_argument("--long-T", type=int, default=None, help="T of the one-head test (default 2^20)")
    ap.add_argument("--det-shape", default=None, help="B,T,H,K,V of the determinism test (default 2,4000,8,128,128)")
    ap.add_argument("--det-ops", default=None, help=f"ops of the determinism test (default all: {','.join(DET_OPS)})")
    ap.add_argument("--q-shape", default=None, help="B,T,H,K,V of the quality test (default 2,2048,16,128,128)")
    ap.add_argument("--q-ops", default=None, help=f"ops of the quality test (default {','.join(Q_OPS)})")
    ap.add_argument("--fla-gsa", action="store_true", help="also compare GSA with fla chunk_gsa (~400 s autotuning)")
    ap.add_argument("--fla-first-call-s", type=float, default=150,
                    help="seconds an fla op's first call is expected to take (autotuning; ~0 when an earlier process "
                         "on this machine autotuned it at the same H, K, V); its side is skipped when less is left")


def ints(s):
    return tuple(int(x) for x in s.split(",") if x)


def limit(name):
    return TOL_DECAY if name in DECAY_GRADS else TOL


def windows(T, W):
    w = [("start", 0, W), ("middle", T // 2 - W // 2, T // 2 + W // 2), ("end", T - W, T)]
    if T > 2**20 + W // 2:
        w.insert(2, ("around_2^20", 2**20 - W // 2, 2**20 + W // 2))
    return [(n, max(a, 0), min(b, T)) for n, a, b in w]


def compare(got, ref, T, W):
    """Whole and windowed relative errors of every tensor in ref (time is dim 1 of [B, T, ...] tensors)."""
    out, ok = {}, True
    for n, r in ref.items():
        if n not in got or got[n] is None:
            continue
        e = dict(all=rel(got[n], r))
        if r.dim() >= 2 and r.shape[1] == T and n not in ("dA",):
            for wn, a, b in windows(T, W):
                e[wn] = rel(got[n][:, a:b], r[:, a:b])
        out[n] = e
        ok = ok and all(v <= limit(n) for v in e.values())
    return out, ok


def fwd_bwd(f, x, do, dS=None, dtype=None, keep=None, clone=True):
    """o (and final state S), gradients of every input as 'd<name>'. The inputs are cloned (cast to dtype,
    e.g. float64 for a reference) so that the caller's x is never touched; clone=False uses x itself (huge
    inputs) and drops its gradients after keep(name, tensor) has taken what it wants (e.g. slices)."""
    keep = keep or (lambda n, t: t)
    if clone:
        xs = {n: (t.detach().to(dtype) if dtype else t.detach().clone()).requires_grad_() for n, t in x.items()}
    else:
        xs = x
    try:
        out = f(xs)
        o, S = out if isinstance(out, tuple) else (out, None)
        res = {"o": keep("o", o.detach())}
        if S is not None:
            res["S"] = S.detach()
        if do is not None:
            do_ = do.to(o.dtype)
            if S is None:
                o.backward(do_)
            else:
                torch.autograd.backward([o, S], [do_, dS.to(S.dtype)])
            res.update({"d" + n: keep("d" + n, t.grad) for n, t in xs.items() if t.grad is not None})
        return res
    finally:
        if not clone:
            for t in xs.values():
                t.grad = None


# ---- big: more than 2^31 elements ---------------------------------------------------------------------------
def big_inputs(kind, shape, dev):
    B, T, H, K, V = shape
    q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16).mul_(K ** -0.5)
    k = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16).mul_(K ** -0.5)
    v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
    x = dict(q=q, k=k, v=v)
    lds = {"constant": lambda: ula.retnet_log_decay(H, dev), "scalar": lambda: torch.randn(B, T, H, device=dev),
           "vector": lambda: torch.randn(B, T, H, K, device=dev)}
    if kind in lds:
        ld = lds[kind]()
        if kind != "constant":  # logsigmoid(x + 4) in place: -log1p(exp(-(x + 4)))
            ld.add_(4).neg_().exp_().log1p_().neg_()
        x["ld"] = ld
    return {n: t.requires_grad_() for n, t in x.items()}


def head_of(name, t, h, kind):
    """Head h of an input or gradient, keeping the head dim (size 1)."""
    if name in ("ld", "dld") and kind == "constant":
        return t[h:h + 1]
    return t[:, :, h:h + 1]


def big_case(run, kind, shape, heads, W):
    B, T, H, K, V = shape
    x = big_inputs(kind, shape, run.device)
    f = fam.ours(kind)
    torch.manual_seed(1)
    do = torch.randn(B, T, H, V, device=run.device, dtype=torch.bfloat16)
    keep_h = lambda n, t: {h: head_of(n, t, h, kind).clone() for h in heads}  # noqa: E731
    info = dict(elements_q=q_elems(shape), elements_over_2_31=q_elems(shape) > 2**31, heads=list(heads))
    run.reset_peak()
    got = None
    try:
        got = fwd_bwd(f, x, do, keep=keep_h, clone=False)
        info["mode"] = "forward+backward"
    except Exception as e:
        if not is_oom(e):
            raise
        info["fwd_bwd_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if got is None:  # out of memory: free what the failed attempt held (outside the except block), forward only
        free_memory()
        with torch.no_grad():
            got = fwd_bwd(f, x, None, keep=keep_h, clone=False)
        info["mode"] = "forward only (forward+backward ran out of memory)"
    info["peak_mib"] = run.peak_mib()
    xh = {h: {n: head_of(n, t, h, kind).detach().clone() for n, t in x.items()} for h in heads}
    doh = {h: do[:, :, h:h + 1].clone() for h in heads}
    del x, do
    free_memory()
    errs, ok = {}, True
    for h in heads:
        ref = fwd_bwd(fam.ours(kind, backend="torch"), xh[h], doh[h] if "dq" in got else None, dtype=torch.float64)
        e, o = compare({n: t[h] for n, t in got.items()}, ref, T, W)
        errs[f"head{h}"] = e
        ok = ok and o
        del ref
        free_memory()
    return dict(info, errors=errs, ok=ok, worst=worst(errs))


def q_elems(shape):
    B, T, H, K, _ = shape
    return B * T * H * K


def worst(errs):
    vals = [v for e in errs.values() for d in (e.values() if isinstance(e, dict) else [e])
            for v in (d.values() if isinstance(d, dict) else [d])]
    return max(vals) if vals else None


# ---- long: T = 2^20 on one head --------------------------------------------------------------------------------
def long_case(run, kind, T, K, W):
    x = fam.make(kind, 1, T, 1, K, K, run.device, torch.bfloat16)
    torch.manual_seed(2)
    do = torch.randn(1, T, 1, K, device=run.device)
    dS = torch.randn(1, 1, K, K, device=run.device)

    def f(backend):
        return lambda xs: ula.linear_attention(xs["q"], xs["k"], xs["v"], xs.get("ld"), output_final_state=True,
                                               backend=backend)

    run.reset_peak()
    got = fwd_bwd(f("auto"), x, do, dS)
    peak = run.peak_mib()
    ref = fwd_bwd(f("torch"), x, do, dS, dtype=torch.float64)
    errs, ok = compare(got, ref, T, W)
    return dict(errors=errs, ok=ok, worst=worst(errs), peak_mib=peak)


# ---- determinism ---------------------------------------------------------------------------------------------
def det_inputs(op, shape, dev, backend="auto"):
    B, T, H, K, V = shape
    if op == "vector_varlen":
        x = fam.make("vector", 1, B * T, H, K, V, dev, torch.bfloat16)
        n = B * T
        cu = torch.tensor([0, n // 5, n // 5 + n // 3 + 7, n], device=dev, dtype=torch.int32)
        h0 = (torch.randn(3, H, K, V, device=dev) * 0.1).requires_grad_()
        x["h0"] = h0
        return x, lambda xs: ula.linear_attention(xs["q"], xs["k"], xs["v"], xs["ld"], initial_state=xs["h0"],
                                                  cu_seqlens=cu, backend=backend)[0]
    x = fam.make(op, B, T, H, K, V, dev, torch.bfloat16, initial_state=True)
    return x, fam.ours(op, backend=backend)


def bits(t):
    t = t.detach().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def bits_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def det_case(run, op, shape, backend="auto"):
    x, f = det_inputs(op, shape, run.device, backend)
    torch.manual_seed(3)
    o_shape = (1, shape[0] * shape[1]) + tuple(shape[2:3]) + (shape[4],) if op == "vector_varlen" else \
        tuple(shape[:3]) + (shape[4],)
    do = torch.randn(o_shape, device=run.device, dtype=torch.bfloat16)
    a = fwd_bwd(f, x, do)
    b = fwd_bwd(f, x, do)
    diff = {}
    for n in a:
        if not bits_equal(a[n], b[n]):
            diff[n] = (a[n].double() - b[n].double()).abs().max().item()
    return dict(bitwise_equal=not diff, tensors=sorted(a), differing=diff)


# ---- quality against fla -------------------------------------------------------------------------------------
def quality_case(run, op, shape, fla_need):
    """Ours and fla against the float64 reference; fla's side only when fla_need seconds (its first call
    autotunes) are left of the budget (None: not at all)."""
    B, T, H, K, V = shape
    x = fam.make(op, B, T, H, K, V, run.device, torch.bfloat16)
    torch.manual_seed(4)
    do = torch.randn(B, T, H, V, device=run.device, dtype=torch.bfloat16)
    ref = fwd_bwd(fam.ours(op, backend="torch"), x, do, dtype=torch.float64)
    sides = {"ours": lambda: fam.ours(op)}
    res = {}
    if fla_need is not None and run.time_left() >= fla_need:
        sides["fla"] = lambda: fam.fla(op)
    elif fla_need is not None:
        res["fla"] = dict(skipped=f"time budget: fla's first call needs ~{fla_need} s, {run.time_left():.0f} s left")
    for side, mk in sides.items():
        try:
            got = fwd_bwd(mk(), x, do)
        except ImportError as e:
            res[side] = dict(skipped=f"not importable: {e}"[:200])
            continue
        except Exception as e:  # e.g. fla refusing a backward: keep its forward error
            res[side] = dict(error=f"{type(e).__name__}: {e}"[:300])
            try:
                with torch.no_grad():
                    got = fwd_bwd(mk(), x, None)
            except Exception as e2:
                res[side]["forward_error"] = f"{type(e2).__name__}: {e2}"[:300]
                continue
        res[side] = dict(res.get(side, {}), **{n: rel(got[n], ref[n]) for n in ref if n in got})
        free_memory()
    names = list(ref)
    no_worse = {n: (res["ours"].get(n) <= res["fla"][n]) for n in names
                if "fla" in res and n in res["fla"] and n in res.get("ours", {})}
    return dict(tensors=names, ours=res.get("ours"), fla=res.get("fla"), ours_no_worse=no_worse,
                ours_within_limits=all(res["ours"].get(n, float("inf")) <= limit(n) for n in names)
                if "ours" in res else None)


# ---- the compute-sanitizer payload (benchmarks/gpu_sanitizer.sh) -----------------------------------------------
def sanitize_payload(run):
    """One small odd shape of every decay kind (initial and final state, forward and backward), varlen, and
    the families, on the Triton backend."""
    dev = run.device
    backend = "auto" if run.smoke else "triton"  # no silent fallback to the PyTorch path on the GPU
    run.meta["backend"] = backend
    cases = [(k, (2, 197, 3, 48, 40)) for k in fam.CORE_KINDS] + [("vector_varlen", (2, 150, 2, 64, 32))]
    cases += [(op, (1, 133, 2, 32, 32)) for op in ("gla", "mlstm_sig", "mlstm_exp", "gsa", "normalized")]
    for op, shape in cases:
        def body(op=op, shape=shape):
            if op == "vector_varlen":
                return det_case(run, op, shape, backend)
            x = fam.make(op, *shape, dev, torch.bfloat16, m=16, initial_state=True)
            B, T, H, K, V = shape
            got = fwd_bwd(fam.ours(op, backend=backend), x,
                          torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16))
            run.sync()
            return dict(finite=all(bool(torch.isfinite(t).all()) for t in got.values()), tensors=sorted(got))
        run.case("sanitize", op, body, shape="B{}_T{}_H{}_K{}_V{}".format(*shape))


# ---- main ----------------------------------------------------------------------------------------------------
def body(run):
    a, smoke, quick = run.args, run.smoke, run.quick
    sections = a.sections.split(",")
    run.meta.update(sections=sections, tolerances=dict(default=TOL, log_decay_grads=TOL_DECAY))
    if "big" in sections:
        kinds = (a.big_kinds or ("none" if quick else "none,vector")).split(",")
        shapes = dict(BIG)
        for item in (a.big_shapes or "").split(";"):
            if item:
                kind, shp = item.split("=")
                shapes[kind] = ints(shp)
        for kind in kinds:
            shape = (1, 3000, 2, 16, 16) if smoke else shapes.get(kind, shapes["none"])
            H = shape[2]
            heads = ints(a.big_heads) if a.big_heads else ((0, H - 1) if quick or smoke else (0, H // 2, H - 1))
            run.case("big", kind, lambda kind=kind, shape=shape, heads=heads: big_case(run, kind, shape, heads,
                                                                                   256 if smoke else 4096),
                     shape="B{}_T{}_H{}_K{}_V{}".format(*shape), need_s=60)
    if "long" in sections:
        T = a.long_T or (2000 if smoke else 2**20)
        for kind in fam.CORE_KINDS:
            run.case("long", kind, lambda kind=kind: long_case(run, kind, T, 16 if smoke else 128,
                                                               256 if smoke else 4096),
                     shape=f"B1_T{T}_H1_K{16 if smoke else 128}", need_s=30)
    if "determinism" in sections:
        shape = ints(a.det_shape) if a.det_shape else ((2, 100, 2, 16, 16) if smoke else (2, 4000, 8, 128, 128))
        ops = a.det_ops.split(",") if a.det_ops else [o for o in DET_OPS if not (quick and o in fam.CONVENIENCES)]
        for op in ops:
            run.case("determinism", op, lambda op=op: det_case(run, op, shape),
                     shape="B{}_T{}_H{}_K{}_V{}".format(*shape), need_s=15)
    if "quality" in sections:
        shape = ints(a.q_shape) if a.q_shape else ((1, 128, 2, 16, 16) if smoke else (2, 2048, 16, 128, 128))
        ops = a.q_ops.split(",") if a.q_ops else list(Q_OPS)
        if a.fla_gsa and "gsa" not in ops:
            ops.append("gsa")
        if smoke:
            run.note("quality: fla is a GPU kernel, so only ours against the float64 reference in CPU smoke mode")
        for op in ops:
            fla_need = None if smoke else max(a.fla_first_call_s, 450 if op == "gsa" else 0)
            run.case("quality", op, lambda op=op, n=fla_need: quality_case(run, op, shape, n),
                     shape="B{}_T{}_H{}_K{}_V{}".format(*shape), need_s=20)
    summarize(run)


def summarize(run):
    big = run.select("big")
    run.check(">2^31 elements: sampled heads within limits", {r["case"]: r.get("worst") for r in big} or None,
              f"<= {TOL} ({TOL_DECAY} log decay)", all(r["ok"] for r in big) if big else None)
    if any(r.get("mode", "").startswith("forward only") for r in big):
        run.note("big: " + ", ".join(r["case"] for r in big if r["mode"].startswith("forward only")) +
                 " ran forward only (forward+backward ran out of memory)")
    lng = run.select("long")
    run.check("T=2^20 one head, every decay kind, within limits", {r["case"]: r.get("worst") for r in lng} or None,
              f"<= {TOL} ({TOL_DECAY} log decay)", all(r["ok"] for r in lng) if lng else None)
    det = run.select("determinism")
    run.check("bitwise deterministic ops", {r["case"]: r["bitwise_equal"] for r in det} or None, "all",
              all(r["bitwise_equal"] for r in det) if det else None)
    qual = [r for r in run.select("quality") if r.get("ours_no_worse")]
    run.check("bf16 error ours <= fla, every shared op and tensor",
              {r["case"]: r["ours_no_worse"] for r in qual} or None, "all",
              all(all(r["ours_no_worse"].values()) for r in qual) if qual else None)
    print_tables(run)


def error_rows(r):
    """Table rows of a big / long result: one per (head, tensor) with the whole and the worst window error."""
    errs = r.get("errors")
    if not errs:
        return [dict(case=r["case"], error=r.get("error"), skipped=r.get("skipped"))]
    per_head = errs if r["section"] == "big" else {"": errs}
    return [dict(case=r["case"], head=h, tensor=n, all=d.get("all"),
                 worst_window=max((v for k, v in d.items() if k != "all"), default=None), ok=d["all"] <= limit(n))
            for h, e in per_head.items() for n, d in e.items()]


def print_tables(run):
    for sec in ("big", "long"):
        rows = [row for r in run.rows if r["section"] == sec for row in error_rows(r)]
        run.print_table(f"{sec}: relative error vs float64", rows, ["case", "head", "tensor", "all", "worst_window"],
                        {"case": 12})
    run.print_table("determinism (bitwise, two runs)", [dict(r, differing=",".join(r.get("differing") or []))
                                                        for r in run.rows if r["section"] == "determinism"],
                    ["case", "bitwise_equal", "differing"], {"case": 14, "differing": 40})
    rows = []
    for r in [r for r in run.rows if r["section"] == "quality"]:
        ours, fla = r.get("ours") or {}, r.get("fla") or {}
        for n in r.get("tensors") or [None]:
            rows.append(dict(case=r["case"], tensor=n, ours=ours.get(n), fla=fla.get(n),
                             no_worse=(r.get("ours_no_worse") or {}).get(n), error=r.get("error"),
                             skipped=r.get("skipped")))
        for side, d in (("ours", ours), ("fla", fla)):
            for key in ("error", "forward_error", "skipped"):
                if d.get(key):
                    run.note(f"quality {r['case']}: {side} {key}: {d[key]}"[:400])
    run.print_table("bf16 relative error vs float64, ours and fla", rows, ["case", "tensor", "ours", "fla", "no_worse"],
                    {"case": 16})


def main():
    run = Run("gpu_hardening", __doc__, add_args, budget=(540, 150))
    if run.args.child == "sanitize":
        run.is_child = False  # a payload of its own: rows printed and saved as usual
        run.name, run.path = "gpu_sanitizer_payload", os.path.join(run.args.out, "gpu_sanitizer_payload.json")
        return run.guarded(lambda: sanitize_payload(run))
    run.guarded(lambda: body(run))


if __name__ == "__main__":
    main()
