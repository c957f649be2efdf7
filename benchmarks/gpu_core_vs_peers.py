"""ula's core op against the peers, one GPU, one run, bfloat16: forward and forward+backward median ms
(triton.testing.do_bench) and peak memory of forward+backward, for every decay kind.

    python3 benchmarks/gpu_core_vs_peers.py [--peers] [--rounds 3] [--shapes "2,8192,16,128,128;8,2048,16,128,128"]
        [--graph] [--out DIR]

Ours run in this process; each peer kernel runs in its own process through the peers' yardstick script
(PEERS_SCRIPT, default ../shared/peers/bench_peers.py or .peers/bench_peers.py), with the same shapes and
the same measurement. Writes $OUT/core_vs_peers.json (with device and library versions) and prints a
table with the ratios ours / best peer.
"""
import argparse
import json
import statistics
import os
import subprocess
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import ula  # noqa: E402
from ula.bench.measure import graph_times, measure, ours as _ours  # noqa: E402  (shared with `ula bench`)

OUT = os.environ.get("OUT", "/tmp")
dev, dt = "cuda", torch.bfloat16


def ours(kind, B, T, H, K, V, C=None):
    return _ours(kind, B, T, H, K, V, C=C, device=dev, dtype=dt)

# peer kernels of the yardstick script that compute the same thing as each of our decay kinds
PEERS = {"none": ["fla_chunk_linear_attn"],
         "constant": ["fla_chunk_simple_gla_const", "lightning_attn2_const"],
         "scalar": ["tfla_mlstm_sig_xl_chunk128"],
         "vector": ["fla_chunk_gla_vector"]}


def peer_rows(names, shape):
    script = os.environ.get("PEERS_SCRIPT") or next(
        (p for p in ("../shared/peers/bench_peers.py", ".peers/bench_peers.py") if os.path.exists(p)), None)
    if script is None:
        print("no peers script found; set PEERS_SCRIPT")
        return []
    path = os.path.join(OUT, "anchors.jsonl")
    if os.path.exists(path):
        os.remove(path)
    B, T, H, K, V = shape
    for n in names:
        subprocess.run([sys.executable, script, n], env=dict(os.environ, SHAPES=f"{B},{T},{H},{K},{V}"),
                       timeout=900)
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="2,8192,16,128,128;8,2048,16,128,128")
    ap.add_argument("--kinds", default="none,constant,scalar,vector")
    ap.add_argument("--chunks", default="", help="comma-separated chunk sizes to time besides the default")
    ap.add_argument("--peers", action="store_true", help="also run the peer kernels (slow: fla autotunes ~2 min per op)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure ours and the peers this many times in turn, per shape; the table gives medians over "
                         "rounds and the spread (two runs on one H100 differed by up to 40%%, session 9)")
    ap.add_argument("--graph", action="store_true",
                    help="also time our ops as CUDA-graph replays (fwd_graph_ms, fwdbwd_graph_ms: the GPU's time alone)")
    ap.add_argument("--out", default=OUT, help="folder of core_vs_peers.json (default $OUT)")
    a = ap.parse_args()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                ula=ula.__version__)
    print(meta)
    rows = []
    for s in a.shapes.split(";"):
        shape = tuple(int(x) for x in s.split(","))
        tag = "B{}_T{}_H{}_K{}_V{}".format(*shape)
        kinds = a.kinds.split(",")
        for rnd in range(a.rounds):
            for kind in kinds:
                for C in [None] + [int(c) for c in a.chunks.split(",") if c]:
                    name = f"ula_{kind}" + (f"_c{C}" if C else "")
                    torch.cuda.empty_cache()
                    fn = args = None
                    try:
                        fn, args = ours(kind, *shape, C=C)
                        f, fb, mem = measure(fn, args)
                        rows.append(dict(kernel=name, kind=kind, shape=tag, chunk=C, fwd_ms=f, fwdbwd_ms=fb,
                                         peak_mib=mem, round=rnd))
                        if a.graph:
                            rows[-1]["fwd_graph_ms"], rows[-1]["fwdbwd_graph_ms"] = graph_times(fn, args)
                    except Exception as e:  # keep going: one failure must not hide the other numbers
                        rows.append(dict(kernel=name, kind=kind, shape=tag, error=repr(e)[:300], round=rnd))
                    print(json.dumps(rows[-1]), flush=True)
                    del fn, args
            if a.peers:
                for r in peer_rows([p for kd in kinds for p in PEERS[kd]], shape):
                    r["kind"] = next(kd for kd in kinds if r["kernel"] in PEERS[kd])
                    r["round"] = rnd
                    rows.append(r)
    summary = _summary(rows)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "core_vs_peers.json"), "w") as fh:
        json.dump(dict(meta=meta, command=" ".join(sys.argv), rows=rows, summary=summary), fh, indent=1)
    print(f"\n{'kernel':<34}{'shape':<26}{'fwd ms':>9}{'f+b ms':>9}{'spread':>15}{'MiB':>9}{'t ratio':>9}{'m ratio':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['kernel']:<34}{r['shape']:<26} ERROR (round {r.get('round', 0)}) {r['error'][:60]}")
    for r in summary:
        peers = [p for p in summary if p["shape"] == r["shape"] and p.get("kind") == r["kind"]
                 and not p["kernel"].startswith("ula_")]
        tr = mr = ""
        if r["kernel"].startswith("ula_") and peers:
            tr = f"{r['fwdbwd_ms'] / min(p['fwdbwd_ms'] for p in peers):.2f}"
            mr = f"{r['peak_mib'] / min(p['peak_mib'] for p in peers):.2f}"
        spread = f"{r['fwdbwd_min']:.3f}-{r['fwdbwd_max']:.3f}"
        print(f"{r['kernel']:<34}{r['shape']:<26}{r['fwd_ms']:>9.3f}{r['fwdbwd_ms']:>9.3f}{spread:>15}"
              f"{r['peak_mib']:>9.1f}{tr:>9}{mr:>9}")


def _summary(rows):
    """Per kernel and shape over the rounds: median fwd and f+b ms, the f+b range, the largest peak."""
    groups = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["kernel"], r["shape"]), []).append(r)
    out = []
    for (kernel, shape), rs in groups.items():
        fb = [r["fwdbwd_ms"] for r in rs]
        out.append(dict(kernel=kernel, kind=rs[0].get("kind"), shape=shape, rounds=len(rs),
                        fwd_ms=statistics.median(r["fwd_ms"] for r in rs), fwdbwd_ms=statistics.median(fb),
                        fwdbwd_min=min(fb), fwdbwd_max=max(fb), peak_mib=max(r["peak_mib"] for r in rs)))
    return out


if __name__ == "__main__":
    main()
