"""The frame shared by the benchmarks/gpu_*.py scripts.

`Run` parses the common flags (--quick, --cpu-smoke, --budget-s, --out), records the run's metadata (device
name, torch / Triton / CUDA / peer versions, the exact command line), runs each case in its own try/except
(an error is recorded and the script goes on; a case that would start after the time budget is recorded as
skipped), rewrites one JSON file in $OUT after every case (so a run cut short still leaves its numbers),
and prints plain-text tables. `child` runs a piece of work in a fresh Python process (a peer kernel that
crashes the compiler takes only that process down) and reads back the rows it prints.

CPU smoke mode (--cpu-smoke, or automatic without CUDA) runs every code path at tiny shapes on the CPU;
the peers (GPU kernels) are skipped there."""
import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback

import torch

ROW_PREFIX = "ROW "


def _versions():
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    import ula
    out["ula"] = ula.__version__
    from .peers import installed
    out["peers"] = installed()
    return out


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def free_memory():
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except RuntimeError as e:  # a kernel fault poisons the context: later cases will record their own errors
            print(f"free_memory: {e}", file=sys.stderr)


def fmt(x, width=10):
    """A table cell: floats with 4 significant digits, None as '-', text cut to the width."""
    if x is None:
        s = "-"
    elif isinstance(x, bool):
        s = "yes" if x else "NO"
    elif isinstance(x, float):
        s = f"{x:.3g}" if abs(x) < 1e-2 and x != 0 else f"{x:.4g}"
    else:
        s = str(x)
    return s[:width].rjust(width)


def table(rows, cols, widths=None):
    """rows: dicts; cols: keys. Rows with an 'error' show it after their name columns."""
    widths = widths or {}
    w = [widths.get(c, max(10, len(c) + 1)) for c in cols]
    lines = ["".join(c[:n].rjust(n) for c, n in zip(cols, w))]
    for r in rows:
        if r.get("error") or r.get("skipped"):
            head = "".join(fmt(r.get(c), n) for c, n in zip(cols[:2], w[:2]))
            why = r.get("error") or f"skipped: {r['skipped']}"
            lines.append(f"{head}  {why[:110]}")
        else:
            lines.append("".join(fmt(r.get(c), n) for c, n in zip(cols, w)))
    return "\n".join(lines)


class Run:
    """One benchmark run: flags, metadata, cases, checks, the JSON file."""

    def __init__(self, name, doc, add_args=None, budget=(360, 150), argv=None):
        ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--quick", action="store_true", help="fewer and smaller cases (about 2 minutes on an H100)")
        ap.add_argument("--cpu-smoke", action="store_true",
                        help="run every code path at tiny shapes on the CPU (automatic without CUDA)")
        ap.add_argument("--budget-s", type=float, default=None,
                        help=f"start no new case after this many seconds (default {budget[0]}, --quick {budget[1]}, "
                             "none in CPU smoke mode)")
        ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"), help="folder of the JSON file ($OUT)")
        ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
        if add_args is not None:
            add_args(ap)
        self.args = ap.parse_args(argv)
        self.smoke = self.args.cpu_smoke or not torch.cuda.is_available()
        self.quick = self.args.quick
        self.device = torch.device("cpu" if self.smoke else "cuda")
        self.dtype = torch.bfloat16
        self.is_child = self.args.child is not None
        budget_s = self.args.budget_s
        if budget_s is None and not self.smoke:
            budget_s = budget[1] if self.quick else budget[0]
        self.budget_s = budget_s
        self.t0 = time.time()
        self.name = name
        os.makedirs(self.args.out, exist_ok=True)
        self.path = os.path.join(self.args.out, name + ("_cpu_smoke" if self.smoke else "") + ".json")
        self.meta = dict(script=name, command=" ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
                         cwd=os.getcwd(), device=device_name(self.device), quick=self.quick, cpu_smoke=self.smoke,
                         budget_s=budget_s, host=platform.node(), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                         env={k: os.environ[k] for k in ("PYTHONPATH", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES",
                                                         "FLA_CACHE_RESULTS") if k in os.environ},
                         **_versions())
        if self.device.type == "cuda":
            p = torch.cuda.get_device_properties(self.device)
            self.meta["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        self.rows, self.notes, self.checks = [], [], []
        if not self.is_child:
            print(json.dumps(self.meta, default=str), flush=True)
            if self.smoke:
                self.note("CPU smoke mode: tiny shapes, PyTorch backend, no timing worth reading, peers skipped")

    # ---- time ---------------------------------------------------------------------------------------------
    def elapsed(self):
        return time.time() - self.t0

    def time_left(self):
        return float("inf") if self.budget_s is None else self.budget_s - self.elapsed()

    # ---- records ------------------------------------------------------------------------------------------
    def note(self, text):
        self.notes.append(text)
        print(f"note: {text}", flush=True)

    def add(self, row):
        self.rows.append(row)
        if self.is_child:
            print(ROW_PREFIX + json.dumps(row, default=str), flush=True)
        else:
            print(json.dumps(row, default=str), flush=True)
            self.save()
        return row

    def case(self, section, name, fn, need_s=0.0, **fields):
        """Run fn() -> dict of results and record {section, case, **fields, **results, wall_s}; on an
        exception record the error (oom: True when out of memory). Skipped when less than need_s seconds
        of the budget are left."""
        row = dict(section=section, case=name, **fields)
        if self.time_left() < max(need_s, 1.0):
            row["skipped"] = f"time budget ({self.budget_s:.0f} s) left {max(self.time_left(), 0):.0f} s, " \
                             f"this case needs ~{need_s:.0f} s"
            return self.add(row)
        t = time.time()
        try:
            row.update(fn() or {})
        except ImportError as e:  # a peer that is not installed
            row["skipped"] = f"not importable: {e}"[:300]
        except Exception as e:  # one failure must not hide the other numbers
            row["error"] = f"{type(e).__name__}: {e}"[:600]
            row["oom"] = is_oom(e)
            traceback.print_exc()
        row["wall_s"] = round(time.time() - t, 2)
        free_memory()
        return self.add(row)

    def check(self, claim, value, target, ok):
        """One of the issue's numbers: what is claimed, what was measured, the bar, met or not (None:
        not measurable in this run)."""
        c = dict(claim=claim, value=value, target=target, ok=ok)
        self.checks.append(c)
        return c

    def select(self, section, **match):
        return [r for r in self.rows if r.get("section") == section and not r.get("error") and not r.get("skipped")
                and all(r.get(k) == v for k, v in match.items())]

    def get(self, section, name, key, **match):
        """The value of key in the matching row; the median where several rows match with numbers (rounds)."""
        vals = [r.get(key) for r in self.select(section, case=name, **match)]
        if len(vals) > 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            return statistics.median(vals)
        return vals[0] if vals else None

    def save(self):
        if self.is_child:
            return
        res = dict(meta=dict(self.meta, elapsed_s=round(self.elapsed(), 1)), notes=self.notes, checks=self.checks,
                   rows=self.rows)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1, default=str)
        os.replace(tmp, self.path)

    def guarded(self, body):
        """body(); an exception outside the cases is recorded as a note, and the JSON is written either way."""
        try:
            body()
        except Exception as e:
            traceback.print_exc()
            self.note(f"the run stopped early: {type(e).__name__}: {e}"[:600])
        finally:
            self.finish()

    def finish(self):
        self.save()
        if self.checks:
            print("\nthe issue's numbers:")
            for c in self.checks:
                mark = {True: "MET", False: "NOT MET", None: "n/a"}[c["ok"]]
                print(f"  [{mark:>7}] {c['claim']}: {c['value']} (bar: {c['target']})")
        for n in self.notes:
            print(f"note: {n}")
        print(f"\nwrote {self.path} ({self.elapsed():.0f} s)")

    def print_table(self, title, rows, cols, widths=None):
        print(f"\n== {title}")
        print(table(rows, cols, widths))

    # ---- devices ------------------------------------------------------------------------------------------
    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def reset_peak(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_mib(self):
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20

    def allocated_mib(self):
        return torch.cuda.memory_allocated() / 2**20 if self.device.type == "cuda" else None

    # ---- child processes ----------------------------------------------------------------------------------
    def child(self, script, child_args, timeout):
        """Run `python script --child ...` with this run's flags; returns (rows it printed, note on how it
        ended). A crash (signal, compiler abort) or a timeout ends only the child."""
        cmd = [sys.executable, script, "--child", *child_args, "--out", self.args.out]
        if self.budget_s is not None:
            cmd += ["--budget-s", f"{max(self.time_left(), 1):.0f}"]
        if self.smoke:
            cmd.append("--cpu-smoke")
        if self.quick:
            cmd.append("--quick")
        t = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=None if timeout == float("inf") else max(timeout, 5))
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            dec = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
            out, err, rc = dec(e.stdout), dec(e.stderr), f"timeout after {timeout:.0f} s"
        rows = [json.loads(line[len(ROW_PREFIX):]) for line in out.splitlines() if line.startswith(ROW_PREFIX)]
        sys.stderr.write(err[-3000:])
        how = dict(child=" ".join(child_args), returncode=rc, child_wall_s=round(time.time() - t, 1))
        if rc != 0:
            how["stderr_tail"] = err[-1500:]
        return rows, how
