"""The loss curve PNG of `ula train`: training loss (and its running mean) and validation, bits per byte."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_loss(history, path, title=""):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    tr = history["train"]
    if tr:
        s = [r[0] for r in tr]
        b = [r[1] / math.log(2) for r in tr]
        ax.plot(s, b, lw=0.6, alpha=0.4, color="tab:blue", label="train")
        k = max(1, len(b) // 50)
        run = [sum(b[max(0, i - k + 1):i + 1]) / len(b[max(0, i - k + 1):i + 1]) for i in range(len(b))]
        ax.plot(s, run, lw=1.5, color="tab:blue", label=f"train (mean of {k})")
    if history["val"]:
        ax.plot([r[0] for r in history["val"]], [r[2] for r in history["val"]], "o-", color="tab:red",
                label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
