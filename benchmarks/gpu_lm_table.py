"""Issue 6's language-model table: `ula train` (byte level, the built-in corpus) for a fixed time with every mixer,
the runs side by side on one GPU, and a table of validation bits per byte.

    python3 benchmarks/gpu_lm_table.py [--minutes 10] [--call-minutes 9] [--mixers gla,...] [--runs /tmp/lm_table]

Every mixer trains the same ~20M-parameter model (d=512, 6 layers, 4 heads; GLA: 19.3M) with the same data
order, batch and learning rate, for --minutes of training time each. All runs share the GPU at once (one
process per mixer), so each gets a share of it: the table compares mixers under equal conditions, not the
throughput of one run alone. A device call lasts at most 10 minutes, so a run stops after --call-minutes and the
next call of the same command resumes it exactly (`ula train --resume`) for what is left; the table is written
after every call, marked partial until every run has its --minutes. Constant learning rate after warm-up: the
number of steps that fits in the time is not known in advance, so no schedule can end on it.
Writes $OUT/lm_table.json, lm_table.md, lm_table.png (validation bits per byte over training time)."""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
MIXERS = "linear,retnet,gla,mlstm_sig,mlstm_exp,gsa,normalized,softmax"
TRAIN = {"--d-model": 512, "--layers": 6, "--heads": 4, "--seq-len": 512, "--batch-size": 16, "--steps": 1000000,
         "--schedule": "constant", "--warmup": 100, "--lr": 1e-3, "--eval-every": 250, "--eval-batches": 16,
         "--save-every": 1000000}
TINY = {"--d-model": 32, "--layers": 1, "--seq-len": 32, "--batch-size": 4, "--warmup": 5}  # --tiny's changes


def trained_s(run_dir):
    path = os.path.join(run_dir, "trained.json")
    return json.load(open(path)) if os.path.exists(path) else dict(seconds=0.0, calls=[])


def launch(mixer, run_dir, minutes, log):
    done = trained_s(run_dir)
    cmd = [sys.executable, "-m", "ula", "train"]
    if done["calls"]:
        cmd += ["--resume", run_dir, "--minutes", f"{minutes:.3f}"]
    else:
        cmd += ["--mixer", mixer, "--minutes", f"{minutes:.3f}", "--out", run_dir]
        cmd += [str(x) for flag_value in TRAIN.items() for x in flag_value]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixers", default=MIXERS)
    ap.add_argument("--minutes", type=float, default=10.0, help="training minutes per mixer, in all")
    ap.add_argument("--call-minutes", type=float, default=9.0, help="training minutes of each run in this call")
    ap.add_argument("--runs", default="/tmp/lm_table", help="run folders (checkpoints; kept for the next call)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: a tiny model for seconds")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="join the rows of earlier lm_table.json files (later files win per mixer), write the "
                         "table and plot to $OUT (default: the current folder) and exit")
    a = ap.parse_args()
    if a.merge:
        return merge(a.merge, os.environ.get("OUT", "."))
    out = os.environ.get("OUT", a.runs)
    os.makedirs(out, exist_ok=True)
    mixers = a.mixers.split(",")
    if a.tiny:
        TRAIN.update(TINY)
    procs = {}
    for m in mixers:
        run_dir = os.path.join(a.runs, m)
        left = a.minutes - trained_s(run_dir)["seconds"] / 60
        if left <= 0.01:
            continue
        os.makedirs(run_dir, exist_ok=True)
        log = open(os.path.join(run_dir, "log.txt"), "a")
        procs[m] = (launch(m, run_dir, min(left, a.call_minutes), log), time.time(), log)
    print(f"{len(procs)} runs side by side: {', '.join(procs)}", flush=True)
    for m, (p, t0, log) in procs.items():
        rc = p.wait()
        log.close()
        run_dir = os.path.join(a.runs, m)
        done = trained_s(run_dir)
        metrics = os.path.join(run_dir, "metrics.json")
        if rc == 0 and os.path.exists(metrics):
            s = json.load(open(metrics))["seconds"]
            done = dict(seconds=done["seconds"] + s, calls=done["calls"] + [s])
            json.dump(done, open(os.path.join(run_dir, "trained.json"), "w"))
        print(f"{m}: exit {rc}, {done['seconds'] / 60:.2f} training minutes so far", flush=True)
    write_table(a, mixers, out)


def device_line():
    try:
        import torch
        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
        return f"CPU, torch {torch.__version__}"
    except ImportError:
        return "unknown"


def write_table(a, mixers, out):
    import triton
    rows = []
    for m in mixers:
        run_dir = os.path.join(a.runs, m)
        path = os.path.join(run_dir, "metrics.json")
        if not os.path.exists(path):
            rows.append(dict(mixer=m, missing=True))
            continue
        r = json.load(open(path))
        val = r["history"]["val"]
        rows.append(dict(mixer=m, parameters=r["parameters"], steps=r["steps_done"],
                         training_minutes=trained_s(run_dir)["seconds"] / 60, final_val_bpb=r["final_val_bpb"],
                         best_val_bpb=min(v[2] for v in val), best_at_step=min(val, key=lambda v: v[2])[0],
                         val=val, tokens_per_step=r["args"]["batch_size"] * r["args"]["seq_len"]))
    complete = all(not r.get("missing") and r["training_minutes"] >= a.minutes - 0.05 for r in rows)
    res = dict(command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]), device=device_line(),
               triton=triton.__version__, minutes=a.minutes, complete=complete, train_args=TRAIN,
               setup="all runs side by side on one GPU, one process each; byte-level pydoc_data.topics corpus",
               rows=rows)
    render(res, out)


def merge(paths, out):
    """One table from several calls' lm_table.json (e.g. a mixer rerun after a fix), on the same GPU kind."""
    parts = [json.load(open(p)) for p in paths]
    if len({(r["device"], r["triton"], r["minutes"], _args_key(r["train_args"])) for r in parts}) > 1:
        raise SystemExit("--merge: the files differ in device, Triton, minutes or training arguments; "
                         "merge only runs made alike")
    by_mixer = {row["mixer"]: (row, p) for p in parts for row in p["rows"]}
    order = [m for m in MIXERS.split(",") if m in by_mixer] + [m for m in by_mixer if m not in MIXERS.split(",")]
    res = dict(parts[-1], rows=[by_mixer[m][0] for m in order],
               complete=all(p["complete"] for p in parts),
               command="; ".join(f"python3 benchmarks/{p['command']}" for p in parts) + "; then python3 "
               "benchmarks/gpu_lm_table.py --merge " + " ".join(os.path.basename(p) for p in paths),
               setup=parts[0]["setup"] + "; rows from separate calls: " + "; ".join(
                   f"{', '.join(r['mixer'] for r in p['rows'])} "
                   f"{'side by side' if len(p['rows']) > 1 else 'alone (more steps in its time)'}" for p in parts))
    render(res, out)


def _args_key(args):
    """The training arguments comparable across the file formats (a flag list in older files, a dict now)."""
    if isinstance(args, list):
        args = dict(zip(args[::2], args[1::2]))
    def num(v):
        try:
            return float(v)
        except ValueError:
            return v
    return tuple(sorted((k, num(v)) for k, v in args.items()))


def render(res, out):
    """lm_table.json, .md and .png in out from a result dict."""
    json.dump(res, open(os.path.join(out, "lm_table.json"), "w"), indent=1)
    cmd = res["command"] if res["command"].startswith("python3 ") else f"python3 benchmarks/{res['command']}"
    lines = [f"Validation bits per byte after {res['minutes']:g} training minutes per mixer"
             f"{'' if res['complete'] else ' (PARTIAL: runs still to resume)'}; {res['device']}, "
             f"Triton {res['triton']}.", f"Setup: {res['setup']}.", f"Command: {cmd}", "",
             "| mixer | parameters | steps | training min | final val bpb | best val bpb (step) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in res["rows"]:
        if r.get("missing"):
            lines.append(f"| {r['mixer']} | - | - | - | no result | - |")
        else:
            lines.append(f"| {r['mixer']} | {r['parameters'] / 1e6:.1f}M | {r['steps']} | "
                         f"{r['training_minutes']:.2f} | {r['final_val_bpb']:.3f} | "
                         f"{r['best_val_bpb']:.3f} ({r['best_at_step']}) |")
    open(os.path.join(out, "lm_table.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(res["rows"], os.path.join(out, "lm_table.png"))


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in rows:
        if not r.get("missing") and r["val"]:
            ax.plot([v[0] for v in r["val"]], [v[2] for v in r["val"]], "o-", ms=2, lw=1.2, label=r["mixer"])
    ax.set_xlabel("step")
    ax.set_ylabel("validation bits per byte")
    ax.set_title("byte-level LM, equal training time per mixer", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
