"""ula's core op against the peers, one GPU, one run, bfloat16: forward and forward+backward median ms
(triton.testing.do_bench) and peak memory of forward+backward, for every decay kind.

    python3 benchmarks/gpu_core_vs_peers.py [--peers] [--shapes "2,8192,16,128,128;8,2048,16,128,128"]

Ours run in this process; each peer kernel runs in its own process through the peers' yardstick script
(PEERS_SCRIPT, default ../shared/peers/bench_peers.py or .peers/bench_peers.py), with the same shapes and
the same measurement. Writes $OUT/core_vs_peers.json (with device and library versions) and prints a
table with the ratios ours / best peer.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import ula  # noqa: E402
from ula.bench.measure import measure, ours as _ours  # noqa: E402  (shared with `ula bench`)

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
    a = ap.parse_args()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                ula=ula.__version__)
    print(meta)
    rows = []
    for s in a.shapes.split(";"):
        shape = tuple(int(x) for x in s.split(","))
        tag = "B{}_T{}_H{}_K{}_V{}".format(*shape)
        kinds = a.kinds.split(",")
        for kind in kinds:
            for C in [None] + [int(c) for c in a.chunks.split(",") if c]:
                name = f"ula_{kind}" + (f"_c{C}" if C else "")
                torch.cuda.empty_cache()
                fn = args = None
                try:
                    fn, args = ours(kind, *shape, C=C)
                    f, fb, mem = measure(fn, args)
                    rows.append(dict(kernel=name, kind=kind, shape=tag, chunk=C, fwd_ms=f, fwdbwd_ms=fb, peak_mib=mem))
                except Exception as e:  # keep going: one failure must not hide the other numbers
                    rows.append(dict(kernel=name, kind=kind, shape=tag, error=repr(e)[:300]))
                print(json.dumps(rows[-1]), flush=True)
                del fn, args
        if a.peers:
            for r in peer_rows([p for kd in kinds for p in PEERS[kd]], shape):
                r["kind"] = next(kd for kd in kinds if r["kernel"] in PEERS[kd])
                rows.append(r)
    with open(os.path.join(OUT, "core_vs_peers.json"), "w") as fh:
        json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    print(f"\n{'kernel':<34}{'shape':<26}{'fwd ms':>9}{'f+b ms':>9}{'MiB':>9}{'t ratio':>9}{'m ratio':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['kernel']:<34}{r['shape']:<26} ERROR {r['error'][:70]}")
            continue
        peers = [p for p in rows if p["shape"] == r["shape"] and p.get("kind") == r["kind"]
                 and not p["kernel"].startswith("ula_") and "error" not in p]
        tr = mr = ""
        if r["kernel"].startswith("ula_") and peers:
            tr = f"{r['fwdbwd_ms'] / min(p['fwdbwd_ms'] for p in peers):.2f}"
            mr = f"{r['peak_mib'] / min(p['peak_mib'] for p in peers):.2f}"
        print(f"{r['kernel']:<34}{r['shape']:<26}{r['fwd_ms']:>9.3f}{r['fwdbwd_ms']:>9.3f}{r['peak_mib']:>9.1f}{tr:>9}{mr:>9}")


if __name__ == "__main__":
    main()
