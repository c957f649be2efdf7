"""The demo's PNG: recall accuracy per mixer (bars, state size above each) and training loss curves."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_demo(res, path):
    rows = res["results"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    x = range(len(rows))
    accs = [100 * r["accuracy"] for r in rows]
    err = [[100 * (r["accuracy"] - r["accuracy_min"]) for r in rows],
           [100 * (r["accuracy_max"] - r["accuracy"]) for r in rows]]
    colors = ["tab:gray" if r["mixer"] == "softmax" else "tab:blue" for r in rows]
    a1.bar(x, accs, yerr=err, color=colors, capsize=3)
    for i, r in enumerate(rows):
        a1.text(i, accs[i] + 1.5, f"{r['state_numbers']}" + ("*" if r["state_grows_with_T"] else ""),
                ha="center", va="bottom", fontsize=7)
    a1.set_xticks(list(x), [r["label"] for r in rows], rotation=30, ha="right")
    a1.set_ylim(0, 112)
    a1.set_ylabel("recall accuracy (%)")
    cfg = res["config"]
    a1.set_title(f"MQAR, {cfg['num_kv']} pairs, T={cfg['T']}, d={cfg['d_model']} "
                 f"(numbers: state per sequence, * = KV cache)", fontsize=9)
    for r in rows:
        c = r["runs"][0]["loss_curve"]
        a2.plot([s for s, _ in c], [v for _, v in c], label=r["label"], lw=1)
    a2.set_xlabel("step")
    a2.set_ylabel("training loss (seed 0)")
    a2.set_yscale("log")
    a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
