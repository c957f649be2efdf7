"""PNG plots of `ula bench`: time (forward, forward+backward; with --graph also forward+backward in CUDA-graph
replays) and peak memory against T, log axes, one panel per decay kind; ours solid, peers dashed."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _panels(res, key, ylabel, path):
    rows = [r for r in res["rows"] if "error" not in r and r.get(key) is not None]
    kinds = [k for k in ("none", "constant", "scalar", "vector") if any(r["kind"] == k for r in rows)]
    soft = [r for r in rows if r["kind"] == "softmax"]
    if not kinds:
        return False
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        sel = [r for r in rows if r["kind"] == kind] + soft
        for name in dict.fromkeys(r["kernel"] for r in sel):
            pts = sorted((r["T"], r[key]) for r in sel if r["kernel"] == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if name.startswith("ula_") else "s--",
                    label=name, lw=1.6 if name.startswith("ula_") else 1.0)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.set_title(f"decay: {kind}", fontsize=9)
        ax.legend(fontsize=7)
    m = res["meta"]
    fig.suptitle(f"{m['device']}, {m['dtype']}, B={m['B']} H={m['H']} K=V={m['K']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_bench(res, out_dir):
    """The plots with data to show, each a PNG in out_dir; returns the names of those written."""
    plots = [("fwdbwd_ms", "forward+backward ms", "time.png"), ("fwd_ms", "forward ms", "time_fwd.png"),
             ("peak_mib", "peak MiB (fwd+bwd)", "memory.png"),
             ("fwdbwd_graph_ms", "forward+backward ms, CUDA-graph replays", "time_graph.png")]
    return [name for key, label, name in plots if _panels(res, key, label, os.path.join(out_dir, name))]
