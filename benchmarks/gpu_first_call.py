"""Seconds of an op's first forward+backward in a fresh process with an empty Triton cache (issue 3: at most 20 s
for a new shape): compilation of every kernel configuration it launches, plus the run.

    python3 benchmarks/gpu_first_call.py [--ops none,constant,scalar,vector,gla,gsa,mlstm_exp,normalized]
                                         [--shape 2,8192,16,128,128]

Each op runs in its own process with TRITON_CACHE_DIR set to a new empty folder; the time is taken inside it
from just before the first call to the end of its backward (torch.cuda.synchronize), so Python start-up, imports
and input creation are not counted; a second f+b in the same process gives the warm time beside it. Writes
$OUT/first_call.json (device, versions, command, seconds per op)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from ula.bench import families
from ula.bench.measure import ours
op, shape = sys.argv[2], tuple(int(x) for x in sys.argv[3].split(","))
if op in families.CORE_KINDS:
    fn, args = ours(op, *shape)
else:
    fn, args = families.as_args(families.ours(op, None), families.make(op, *shape, "cuda", torch.bfloat16))
torch.cuda.synchronize()
times = []
for _ in range(2):
    t0 = time.perf_counter()
    out = fn(*args)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
print(json.dumps(dict(op=op, first_s=times[0], warm_s=times[1])))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="none,constant,scalar,vector,gla,gsa,mlstm_exp,normalized")
    ap.add_argument("--shape", default="2,8192,16,128,128")
    a = ap.parse_args()
    import torch
    import triton
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    rows = []
    for op in a.ops.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            r = subprocess.run([sys.executable, "-c", CHILD, root, op, a.shape], env=env, capture_output=True,
                               text=True, timeout=600)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        rows.append(json.loads(line[-1]) if r.returncode == 0 and line else
                    dict(op=op, error=(r.stderr or r.stdout)[-500:]))
        print(json.dumps(rows[-1]), flush=True)
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               command=" ".join(sys.argv), shape=a.shape, limit_s=20, rows=rows)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "first_call.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    for r in rows:
        print(f"{r['op']:<12}" + (f"first {r['first_s']:6.1f} s   warm {r['warm_s'] * 1e3:8.2f} ms"
                                  f"   {'ok' if r['first_s'] <= 20 else 'OVER 20 s'}" if "error" not in r
                                  else f"ERROR {r['error'][-200:]}"))


if __name__ == "__main__":
    main()
