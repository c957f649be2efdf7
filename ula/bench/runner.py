"""`ula bench`: ours (every decay kind) against the installed peers over sequence lengths, one run:
forward and forward+backward time, peak memory (GPU); a table, results.json, time.png and memory.png.
On a CPU only ours and SDPA are timed (the peers are GPU kernels), with no memory figure."""
import json
import os
import platform
import time

import torch

import ula

from ..train.errors import ConfigError
from ..train.files import atomic_files, atomic_path, check_out_dir
from .measure import graph_times, measure_on, ours
from .peers import GPU_ONLY, PEERS, installed

KINDS = ("none", "constant", "scalar", "vector")


def _row(kernel, kind, T, shape, fn_args, device, reps, graph):
    fn, args = fn_args
    f, fb, mem = measure_on(device, fn, args, reps)
    row = dict(kernel=kernel, kind=kind, T=T, shape=shape, fwd_ms=f, fwdbwd_ms=fb, peak_mib=mem)
    if graph:  # the GPU's time alone: short calls are bound by the host's launches when timed eagerly
        try:
            row["fwd_graph_ms"], row["fwdbwd_graph_ms"] = graph_times(fn, args)
        except Exception as e:  # a kernel that waits for the host cannot be captured: its eager times stand
            row["graph_error"] = repr(e)[:300]
    return row


def check_args(kinds, seq_lens, batch, heads, head_dim, reps):
    """Raises ConfigError, naming the argument, unless every one is usable (None: its default)."""
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        raise ConfigError(f"kinds (--kinds) must be one or more of {', '.join(KINDS)}, got {list(kinds)!r}")
    if seq_lens is not None and (not seq_lens or any(isinstance(t, bool) or not isinstance(t, int) or t < 1
                                                     for t in seq_lens)):
        raise ConfigError(f"seq_lens (--seq-lens) must be one or more integers >= 1, got {seq_lens!r}")
    for name, v in (("batch", batch), ("heads", heads), ("head_dim", head_dim), ("reps", reps)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{name} (--{name.replace('_', '-')}) must be an integer >= 1, got {v!r}")


def run_bench(out_dir, kinds=KINDS, seq_lens=None, batch=None, heads=None, head_dim=None, peers=True,
              device="auto", reps=None, graph=None):
    """Times every case and writes results.json and the PNG plots into out_dir, each whole or not at all
    (a former one is left as it was); the arguments and out_dir are checked before any timing. graph: also the
    medians of CUDA-graph replays, the GPU's time without the host's (None: on a GPU, not on a CPU)."""
    from ..train.loop import pick_device
    check_args(kinds, seq_lens, batch, heads, head_dim, reps)
    check_out_dir(out_dir)
    dev = pick_device(device)
    gpu = dev.type == "cuda"
    if graph is None:
        graph = gpu
    if graph and not gpu:
        raise ConfigError(f"graph (--graph) times CUDA-graph replays and needs a CUDA GPU; this run is on {dev}: "
                          "leave --graph out")
    if not gpu:
        print("note: no CUDA GPU in use, so the peers (GPU kernels: fla, mlstm-kernels, lightning-attn) are "
              "skipped; timing ours (PyTorch chunk path) and SDPA on the CPU, float32, no memory figures")
    dt = torch.bfloat16 if gpu else torch.float32
    seq_lens = seq_lens or ([1024, 2048, 4096, 8192, 16384] if gpu else [256, 512, 1024])
    B = batch or (4 if gpu else 1)
    H = heads or (16 if gpu else 2)
    D = head_dim or (128 if gpu else 32)
    reps = reps or 3
    cpu = platform.processor() or platform.machine()
    meta = dict(device=torch.cuda.get_device_name(dev) if gpu else f"CPU ({cpu}, {torch.get_num_threads()} threads)",
                torch=torch.__version__, ula=ula.__version__,
                peers_installed=installed(), dtype=str(dt).replace("torch.", ""), B=B, H=H, K=D, V=D,
                seq_lens=seq_lens, graph=bool(graph), time=time.strftime("%Y-%m-%d %H:%M:%S"))
    if gpu:
        try:
            import triton
            meta["triton"] = triton.__version__
        except ImportError:
            pass
    print(json.dumps(meta))
    rows, skipped = [], {}
    for T in seq_lens:
        shape = f"B{B}_T{T}_H{H}_K{D}_V{D}"
        cases = [(f"ula_{k}", k, lambda k=k: ours(k, B, T, H, D, D, device=dev, dtype=dt)) for k in kinds]
        if peers:
            for kind in list(kinds) + ["softmax"]:
                for name, make in PEERS[kind]:
                    if not gpu and name in GPU_ONLY:
                        skipped[name] = "GPU kernel, CPU run"
                        continue
                    cases.append((name, kind, lambda make=make: make(B, T, H, D, D, dev, dt)))
        for name, kind, make in cases:
            if gpu:
                torch.cuda.empty_cache()
            try:
                rows.append(_row(name, kind, T, shape, make(), dev, reps, graph))
            except ImportError as e:
                skipped[name] = f"not installed ({e})"
                continue
            except Exception as e:  # one failure must not hide the other numbers
                rows.append(dict(kernel=name, kind=kind, T=T, shape=shape, error=repr(e)[:300]))
            print(json.dumps(rows[-1]), flush=True)
    res = dict(meta=meta, rows=rows, skipped=skipped)
    os.makedirs(out_dir, exist_ok=True)
    with atomic_path(os.path.join(out_dir, "results.json"), "the results") as tmp, open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    from .plots import plot_bench
    with atomic_files(out_dir, "the plots") as tmp:
        pngs = plot_bench(res, tmp)
    print(format_table(res))
    if skipped:
        print("skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    print(f"wrote {out_dir}/results.json" + "".join(f", {name}" for name in pngs))
    return res


def format_table(res):
    graph = res["meta"].get("graph", False)
    lines = [f"{'kernel':<30}{'kind':<10}{'T':>7}{'fwd ms':>10}{'f+b ms':>10}{'peak MiB':>10}"
             + (f"{'graph fwd':>11}{'graph f+b':>11}" if graph else "")]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"{r['kernel']:<30}{r['kind']:<10}{r['T']:>7}  ERROR {r['error'][:60]}")
            continue
        mem = "" if r["peak_mib"] is None else f"{r['peak_mib']:.1f}"
        line = f"{r['kernel']:<30}{r['kind']:<10}{r['T']:>7}{r['fwd_ms']:>10.3f}{r['fwdbwd_ms']:>10.3f}{mem:>10}"
        if graph:
            line += (f"{r['fwd_graph_ms']:>11.3f}{r['fwdbwd_graph_ms']:>11.3f}" if "fwd_graph_ms" in r
                     else "  no graph: " + r.get("graph_error", "?")[:50])
        lines.append(line)
    return "\n".join(lines)
