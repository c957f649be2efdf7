"""The families (issue 4) against the peers, one GPU, one run, bfloat16, B=2 T=8192 H=16 K=V=128.

    python3 benchmarks/gpu_families_vs_peers.py [--quick] [--cpu-smoke] [--peers fla_gla,...] [--budget-s 540]
                                                [--rounds 3]   # ours and the peers again in turn; checks on medians
    python3 benchmarks/gpu_families_vs_peers.py --plot-from $OUT/gpu_families_vs_peers.json   # redraw the PNG

Sections (--sections, default all four):
  ops     ours: ula.gla, ula.mlstm sig and exp, ula.gsa (m=64 slots), ula.normalized_linear_attention (and
          without its L2 norm of q, k: normalized_nol2), ula.linear_attention (no decay; and on the same
          L2-normalized q, k by F.normalize: linear_l2, and by ula's L2 kernels: linear_l2_fused): forward ms,
          forward+backward ms, peak MiB (ula.bench.measure).
          GSA with m=64 and K=V=128 holds K*m + m*V = 16384 numbers per head, GLA K*V = 16384: the
          comparison of the two at this shape is at equal state size.
  peers   each peer in its own process (a compiler crash takes only that process down; TFLA's mLSTMexp
          is known to crash Triton 3.6 on H100): fla chunk_gla, mlstm-kernels TFLA mLSTMsig (chunk 128,
          normalized as by default, and with normalize=False, which is what ours computes), TFLA
          mLSTMexp, fla chunk_linear_attn(normalize=True), fla chunk_gsa (not by default: its autotuning
          alone takes ~400 s; add it with --peers ...,fla_gsa).
  memory  peak MiB of forward+backward of our normalized linear attention and fla's, B=1, T = 8192 ..
          131072; a side stops at its first out-of-memory (recorded).
  tfla    our mLSTMsig over chunk sizes 64..1024 (forward+backward ms, peak MiB), drawn as memory vs
          runtime with the points labelled by chunk size (paper 003, Fig. 5) into $OUT/tfla_tradeoff_mlstm_sig.png.

Peers are imported from PYTHONPATH (e.g. /tmp/site, installed from .whl); a missing one is skipped with a
note. fla autotunes ~2 min per op on its first call (results cached on disk by Triton for later processes).
Each peer has an expected cost; one that does not fit in what is left of --budget-s (default 540 s, --quick
150 s) is skipped, recorded; no new case starts after the budget.
Writes $OUT/gpu_families_vs_peers.json (device, versions, command line, every number, the issue's bars)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ula.bench import families as fam  # noqa: E402
from ula.bench.measure import graph_times, measure_on  # noqa: E402
from ula.bench.script import Run  # noqa: E402

SCRIPT = os.path.abspath(__file__)
OURS = ("gla", "mlstm_sig", "mlstm_exp", "gsa", "normalized", "linear", "normalized_nol2", "linear_l2",
        "linear_l2_fused")
MORE = ("abc", "abc_fla_form")  # ours on request (--ours), not by default
# peer -> (what it is, our op it is set against, expected seconds of a first call in a fresh process)
PEERS = {
    "tfla_sig": ("mlstm-kernels TFLA mLSTMsig, chunk 128 (normalize=True, its default)", "mlstm_sig", 45),
    "tfla_sig_nonorm": ("mlstm-kernels TFLA mLSTMsig, chunk 128, normalize=False", "mlstm_sig", 45),
    "tfla_exp": ("mlstm-kernels TFLA mLSTMexp, chunk 128", "mlstm_exp", 45),
    "fla_gla": ("fla chunk_gla", "gla", 180),
    "fla_norm": ("fla chunk_linear_attn(normalize=True)", "normalized", 200),
    "fla_gsa": ("fla chunk_gsa, m=64", "gsa", 450),
    "fla_abc": ("fla chunk_abc, m=64 (its ABC form: earlier writes rescaled; ours as ula.gsa)", "abc_fla_form", 450),
}
DEFAULT_PEERS = "tfla_sig,tfla_sig_nonorm,tfla_exp,fla_gla,fla_norm"
QUICK_PEERS = "tfla_sig,tfla_exp"
PLOT = "tfla_tradeoff_mlstm_sig.png"


def add_args(ap):
    ap.add_argument("--shape", default=None, help="B,T,H,K,V (default 2,8192,16,128,128; CPU smoke 1,128,2,32,32)")
    ap.add_argument("--ours", default=",".join(OURS), help="our ops to time")
    ap.add_argument("--peers", default=None, help=f"peers to time, from {','.join(PEERS)} (default {DEFAULT_PEERS}; "
                                                  f"--quick {QUICK_PEERS}); 'none' for none")
    ap.add_argument("--sections", default="ops,peers,tfla,memory")
    ap.add_argument("--chunks", default=None,
                    help="mLSTMsig chunk sizes (default 64,128,256,512,1024; quick 64,256,1024)")
    ap.add_argument("--mem-T", default=None, help="sequence lengths of the memory sweep "
                                                   "(default 8192,16384,32768,65536,131072; quick 8192,32768,131072)")
    ap.add_argument("--slots", type=int, default=64, help="GSA slots m")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time our ops and the non-TFLA peers this many times in turn; the checks take medians (two "
                         "single runs on one H100 differed by up to 40%%, session 9)")
    ap.add_argument("--plot-from", default=None, help="redraw the PNG from a results JSON and exit")
    ap.add_argument("--graph", action="store_true",
                    help="also time CUDA-graph replays (fwd_graph_ms, fwdbwd_graph_ms: GPU time without the host's); "
                         "the ratio checks are then repeated on them")


def ints(s):
    return [int(x) for x in s.split(",") if x]


def config(run):
    a = run.args
    shape = tuple(ints(a.shape)) if a.shape else ((1, 128, 2, 32, 32) if run.smoke else (2, 8192, 16, 128, 128))
    chunks = ints(a.chunks) if a.chunks else ([16, 32, 64] if run.smoke else
                                              [64, 256, 1024] if run.quick else [64, 128, 256, 512, 1024])
    mem_T = ints(a.mem_T) if a.mem_T else ([128, 256] if run.smoke else
                                           [8192, 32768, 131072] if run.quick else [8192, 16384, 32768, 65536, 131072])
    peers = a.peers if a.peers is not None else (QUICK_PEERS if run.quick else DEFAULT_PEERS)
    peers = [] if peers == "none" else peers.split(",")
    bad = [p for p in peers if p not in PEERS] + [o for o in a.ours.split(",") if o not in OURS + MORE]
    if bad:
        raise SystemExit(f"unknown ops or peers {bad}; ours: {OURS + MORE}, peers: {tuple(PEERS)}")
    return shape, chunks, mem_T, peers


def timed(run, f, x):
    fn, args = fam.as_args(f, x)
    t_f, t_fb, mem = measure_on(run.device, fn, args, reps=2)
    res = dict(fwd_ms=t_f, fwdbwd_ms=t_fb, peak_mib=mem)
    if run.args.graph and run.device.type == "cuda":  # after the memory figure: a graph's pool holds its own buffers
        try:
            res["fwd_graph_ms"], res["fwdbwd_graph_ms"] = graph_times(fn, args)
        except Exception as e:  # noqa: BLE001  (a peer or op that cannot be captured keeps its eager numbers)
            res["graph_error"] = f"{type(e).__name__}: {e}"[:300]
    return res


def ours_case(run, op, shape, slots, chunk=None):
    B, T, H, K, V = shape
    x = fam.make(op, B, T, H, K, V, run.device, run.dtype, m=slots)
    res = timed(run, fam.ours(op, chunk_size=chunk), x)
    res["state_numbers_per_head"] = fam.state_numbers(op, K, V, slots)
    return res


def sweep(run, section, name, mem_T, shape, make_fn):
    """Peak memory over T (B=1); stops after the first out-of-memory."""
    _, _, H, K, V = shape
    for T in mem_T:
        row = run.case(section, name, lambda T=T: timed(run, *make_fn(T)), T=T, shape=f"B1_T{T}_H{H}_K{K}_V{V}")
        if row.get("oom"):
            run.note(f"{name}: out of memory at T={T}; larger T not tried")
            break


# ---- peers (each in a child process) ---------------------------------------------------------------------
def peer_fn(name, shape, slots, dtype, device):
    """(f, x) of a peer at shape."""
    B, T, H, K, V = shape
    if name.startswith("tfla"):
        f = fam.tfla("exp" if name == "tfla_exp" else "sig", 128, normalize=name != "tfla_sig_nonorm", dtype=dtype)
        return f, fam.make_tfla(B, T, H, K, V, device, dtype)
    op = {"fla_gla": "gla", "fla_norm": "normalized_pos", "fla_gsa": "gsa", "fla_abc": "abc_fla_form"}[name]
    return fam.fla(op), fam.make(op, B, T, H, K, V, device, dtype, m=slots)


def child_main(run):
    name = run.args.child
    shape, _, mem_T, _ = config(run)
    B, T, H, K, V = shape
    tag = "B{}_T{}_H{}_K{}_V{}".format(*shape)
    if run.smoke:
        run.add(dict(section="peers", case=name, shape=tag, skipped="CPU smoke mode: peers are GPU kernels"))
        return
    run.case("peers", name, lambda: timed(run, *peer_fn(name, shape, run.args.slots, run.dtype, run.device)),
             shape=tag, what=PEERS[name][0])
    if name == "fla_norm" and "memory" in run.args.sections:
        sweep(run, "memory", "fla_normalized", mem_T, shape,
              lambda T: peer_fn(name, (1, T, H, K, V), run.args.slots, run.dtype, run.device))


def run_peer(run, name, shape, mem_T, rnd=0):
    what, _, need = PEERS[name]
    if rnd > 0:  # its autotuning is cached on disk by the first round
        need = 30
    tag = "B{}_T{}_H{}_K{}_V{}".format(*shape)
    if name == "fla_norm" and "memory" in run.args.sections:
        need += 15 * len(mem_T)
    if run.time_left() < need:
        run.add(dict(section="peers", case=name, shape=tag, what=what,
                     skipped=f"needs ~{need} s (first call, autotuning), {max(run.time_left(), 0):.0f} s of the "
                             f"budget left; raise --budget-s"))
        return
    args = ["--shape", ",".join(map(str, shape)), "--mem-T", ",".join(map(str, mem_T)),
            "--sections", run.args.sections, "--slots", str(run.args.slots)] + (["--graph"] if run.args.graph else [])
    rows, how = run.child(SCRIPT, [name] + args, timeout=min(run.time_left() + 30, 3 * need))  # a hang ends too
    for r in rows:
        run.add(dict(r, round=rnd, **{k: v for k, v in how.items() if k != "stderr_tail"}))
    if not any(r.get("section") == "peers" for r in rows):
        run.add(dict(section="peers", case=name, shape=tag, what=what,
                     error=f"the child process ended ({how['returncode']}) without a result: "
                           f"{how.get('stderr_tail', '')[-400:]}", **how))


# ---- the plot --------------------------------------------------------------------------------------------
def plot(rows, peer_rows, meta, path):
    """Memory vs forward+backward runtime of our mLSTMsig, one point per chunk size (paper 003, Fig. 5)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pts = sorted((r["chunk"], r["fwdbwd_ms"], r.get("peak_mib")) for r in rows)
    if not pts:
        return False
    no_mem = all(p[2] is None for p in pts)
    ys = [0.0 if p[2] is None else p[2] for p in pts]
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    ax.plot([p[1] for p in pts], ys, "o-", color="tab:blue", label="ula mLSTMsig (chunk size)")
    for (c, t, _), y in zip(pts, ys):
        ax.annotate(str(c), (t, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    for r, color in zip(peer_rows, ("tab:orange", "tab:green", "tab:purple")):
        if r.get("peak_mib") is not None:
            ax.plot([r["fwdbwd_ms"]], [r["peak_mib"]], "s", color=color,
                    label=r["case"].replace("_", " ") + " (chunk 128)")
    ax.set_xlabel("forward+backward runtime (ms)")
    ax.set_ylabel("peak memory of forward+backward (MiB)" + (" (none on CPU)" if no_mem else ""))
    s = meta.get("shape", "")
    ax.set_title(f"TFLA trade-off, mLSTMsig, {meta.get('device', '')}\n{s} bf16", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_from(path):
    with open(path) as f:
        res = json.load(f)
    rows = [r for r in res["rows"] if r.get("section") == "tfla" and "fwdbwd_ms" in r]
    peers = [r for r in res["rows"] if r.get("section") == "peers" and r.get("case", "").startswith("tfla_sig")
             and "fwdbwd_ms" in r]
    out = os.path.join(os.path.dirname(os.path.abspath(path)), PLOT)
    meta = dict(res["meta"], shape=res["meta"].get("shape", ""))
    print("wrote", out) if plot(rows, peers, meta, out) else print("no tfla rows in", path)


# ---- the bars ------------------------------------------------------------------------------------
# (claim, (section, case, key) / (section, case, key), bar, test): ratios of the numbers
RATIOS = [
    ("mlstm_sig forward+backward / TFLA sig", ("ops", "mlstm_sig", "fwdbwd_ms"), ("peers", "tfla_sig", "fwdbwd_ms"),
     "< 1", lambda v: v < 1),
    ("mlstm_sig peak MiB / TFLA sig", ("ops", "mlstm_sig", "peak_mib"), ("peers", "tfla_sig", "peak_mib"),
     "< 1", lambda v: v < 1),
    ("mlstm_sig forward+backward / TFLA sig normalize=False (ours has no normalizer)",
     ("ops", "mlstm_sig", "fwdbwd_ms"), ("peers", "tfla_sig_nonorm", "fwdbwd_ms"), "< 1 (info)", lambda v: v < 1),
    ("gla forward+backward / fla chunk_gla", ("ops", "gla", "fwdbwd_ms"), ("peers", "fla_gla", "fwdbwd_ms"),
     "< 1", lambda v: v < 1),
    ("gla peak MiB / fla chunk_gla", ("ops", "gla", "peak_mib"), ("peers", "fla_gla", "peak_mib"),
     "< 1", lambda v: v < 1),
    ("gsa forward+backward / fla chunk_gsa", ("ops", "gsa", "fwdbwd_ms"), ("peers", "fla_gsa", "fwdbwd_ms"),
     "< 1", lambda v: v < 1),
    ("gsa peak MiB / fla chunk_gsa", ("ops", "gsa", "peak_mib"), ("peers", "fla_gsa", "peak_mib"),
     "< 1", lambda v: v < 1),
    ("mlstm_exp / mlstm_sig forward+backward", ("ops", "mlstm_exp", "fwdbwd_ms"), ("ops", "mlstm_sig", "fwdbwd_ms"),
     "<= 1.3", lambda v: v <= 1.3),
    ("mlstm_exp forward / mlstm_sig forward (sig at least 25% faster)", ("ops", "mlstm_exp", "fwd_ms"),
     ("ops", "mlstm_sig", "fwd_ms"), ">= 1.25", lambda v: v >= 1.25),
    ("gsa / gla forward+backward at equal state size", ("ops", "gsa", "fwdbwd_ms"), ("ops", "gla", "fwdbwd_ms"),
     "<= 2.2", lambda v: v <= 2.2),
    ("normalized / linear forward+backward", ("ops", "normalized", "fwdbwd_ms"), ("ops", "linear", "fwdbwd_ms"),
     "<= 1.2", lambda v: v <= 1.2),
    ("normalized without the L2 norm of q, k / linear forward+backward", ("ops", "normalized_nol2", "fwdbwd_ms"),
     ("ops", "linear", "fwdbwd_ms"), "<= 1.2 (info)", lambda v: v <= 1.2),
    ("normalized / linear on the same L2-normalized q, k (F.normalize) forward+backward",
     ("ops", "normalized", "fwdbwd_ms"), ("ops", "linear_l2", "fwdbwd_ms"), "<= 1.2 (info)", lambda v: v <= 1.2),
    ("normalized / linear on the same L2-normalized q, k (ula's L2 kernels) forward+backward",
     ("ops", "normalized", "fwdbwd_ms"), ("ops", "linear_l2_fused", "fwdbwd_ms"), "<= 1.2 (info)",
     lambda v: v <= 1.2),
]


def checks(run, mem_T):
    for claim, num, den, target, test in RATIOS:
        a, b = run.get(*num), run.get(*den)
        v = None if a is None or b is None else round(a / b, 3)
        run.check(claim, v, target, None if v is None else bool(test(v)))
    if run.args.graph:  # the same ratios of times, in GPU time (graph replays), where both sides were captured
        for claim, num, den, target, test in RATIOS:
            if not num[2].endswith("_ms"):
                continue
            a, b = (run.get(s, c, k.replace("_ms", "_graph_ms")) for s, c, k in (num, den))
            v = None if a is None or b is None else round(a / b, 3)
            run.check(claim + " (CUDA graph replays)", v, target, None if v is None else bool(test(v)))
    tried = [r for r in run.rows if r.get("section") == "ops" and r.get("case") == "mlstm_exp" and not r.get("skipped")]
    ran = bool(run.select("ops", case="mlstm_exp"))
    run.check("our mLSTMexp compiles and runs here", ran if tried else None, "runs", ran if tried else None)
    ours_mem = {r["T"]: r["peak_mib"] for r in run.select("memory", case="ula_normalized")}
    fla_mem = {r["T"]: r["peak_mib"] for r in run.select("memory", case="fla_normalized")}
    Ts = sorted(t for t, m in ours_mem.items() if m)
    growth = None if len(Ts) < 2 else round((ours_mem[Ts[-1]] / ours_mem[Ts[0]]) / (Ts[-1] / Ts[0]), 3)
    run.check(f"normalized peak memory ratio / T ratio, T={Ts[0] if Ts else '-'}..{Ts[-1] if Ts else '-'}", growth,
              "<= 1.1 (at most linear in T)", None if growth is None else growth <= 1.1)
    both = [t for t in Ts if fla_mem.get(t)]
    run.check("fla normalized / ours peak memory per T (paper 001 claims 3.6x vs GLA's implementation)",
              {t: round(fla_mem[t] / ours_mem[t], 2) for t in both} or None, "> 1 (info)",
              None if not both else all(fla_mem[t] > ours_mem[t] for t in both))
    missing = [t for t in mem_T if t not in ours_mem]
    if missing and "memory" in run.args.sections:
        run.note(f"our normalized memory sweep has no number for T={missing} (see rows: skipped, OOM or error)")


def body(run):
    shape, chunks, mem_T, peers = config(run)
    B, T, H, K, V = shape
    tag = f"B{B}_T{T}_H{H}_K{K}_V{V}"
    sections = run.args.sections.split(",")
    run.meta.update(shape=tag, dtype="bfloat16", slots=run.args.slots, peers_asked=peers, chunks=chunks, mem_T=mem_T,
                    sections=sections)
    if "ops" in sections:
        for op in run.args.ours.split(","):
            run.case("ops", op, lambda op=op: ours_case(run, op, shape, run.args.slots), shape=tag, need_s=20, round=0)
    if "peers" in sections:
        for p in [p for p in peers if p.startswith("tfla")]:
            run_peer(run, p, shape, mem_T)
    if "tfla" in sections:
        for c in chunks:
            run.case("tfla", "ula_mlstm_sig", lambda c=c: ours_case(run, "mlstm_sig", shape, run.args.slots, c),
                     chunk=c, shape=tag, need_s=15)
        peer_rows = run.select("peers", case="tfla_sig") + run.select("peers", case="tfla_sig_nonorm")
        path = os.path.join(run.args.out, PLOT)
        try:
            if plot(run.select("tfla"), peer_rows, run.meta, path):
                run.meta["plot"] = path
                print("wrote", path)
        except Exception as e:  # no matplotlib: redraw later with --plot-from
            run.note(f"plot not drawn ({type(e).__name__}: {e}); redraw with --plot-from {run.path}")
    if "memory" in sections:
        sweep(run, "memory", "ula_normalized", mem_T, shape,
              lambda T: (fam.ours("normalized"), fam.make("normalized", 1, T, H, K, V, run.device, run.dtype)))
    if "peers" in sections:
        for p in [p for p in peers if not p.startswith("tfla")]:
            run_peer(run, p, shape, mem_T)
    for rnd in range(1, run.args.rounds):  # ours and the peers again, in turn
        if "ops" in sections:
            for op in run.args.ours.split(","):
                run.case("ops", op, lambda op=op: ours_case(run, op, shape, run.args.slots), shape=tag, need_s=20,
                         round=rnd)
        if "peers" in sections:
            for p in [p for p in peers if not p.startswith("tfla")]:
                run_peer(run, p, shape, mem_T, rnd)
    checks(run, mem_T)
    cols = ["case", "shape", "fwd_ms", "fwdbwd_ms", "peak_mib", "wall_s"]
    if run.args.graph:
        cols[4:4] = ["fwd_graph_ms", "fwdbwd_graph_ms"]
    run.print_table("ours and the peers, " + tag, [r for r in run.rows if r["section"] in ("ops", "peers")],
                    cols, {"case": 18, "shape": 26})
    run.print_table("TFLA trade-off, our mLSTMsig", [r for r in run.rows if r["section"] == "tfla"],
                    ["case", "chunk", "fwd_ms", "fwdbwd_ms", "peak_mib"], {"case": 18})
    run.print_table("memory over T, B=1", [r for r in run.rows if r["section"] == "memory"],
                    ["case", "T", "fwd_ms", "fwdbwd_ms", "peak_mib"], {"case": 18})


def main():
    run = Run("gpu_families_vs_peers", __doc__, add_args, budget=(540, 150))
    if run.args.plot_from:
        return plot_from(run.args.plot_from)
    if run.is_child:
        return child_main(run)
    run.guarded(lambda: body(run))


if __name__ == "__main__":
    main()
