"""CPU, float32, B=1 H=4 T=4096 K=V=64, vector decay: forward+backward of the PyTorch chunk path against
the step-by-step float64 reference (issue "Foundation": at least 20x faster), and memory: the largest
tensor any op creates during forward+backward (must stay far below one [T, K, V] tensor) and the peak
resident memory as T grows (must grow linearly, O(T*D + (T/C)*K*V)).

    .venv/bin/python benchmarks/cpu_chunk_vs_reference.py > benchmarks/cpu_chunk_vs_reference.txt
"""
import json
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import ula

B, H, K, V = 1, 4, 64, 64


def inputs(T, dtype=torch.float32):
    q, k, v = (torch.randn(B, T, H, d, dtype=dtype) for d in (K, K, V))
    ld = F.logsigmoid(torch.randn(B, T, H, K) + 3).to(dtype if dtype == torch.float64 else torch.float32)
    return [x.requires_grad_() for x in (q, k, v, ld)]


def fwd_bwd(backend, T, dtype=torch.float32):
    q, k, v, ld = inputs(T, dtype)
    t0 = time.perf_counter()
    o, _ = ula.linear_attention(q, k, v, ld, backend=backend)
    o.backward(torch.ones_like(o))
    return time.perf_counter() - t0


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor produced by any op."""
    def __init__(self):
        super().__init__()
        self.numel, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.op = t.numel(), str(func)
        return out


def peak_rss_child(T):
    """Peak resident memory (MiB) of a fresh process during one forward+backward at length T, above its
    resident memory once the inputs exist (Linux: the high-water mark is reset through clear_refs)."""
    code = f"""
import torch, sys
sys.path.insert(0, {repr(sys.path[0] + '/..')})
from benchmarks.cpu_chunk_vs_reference import inputs, ula
def status(key):
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key))
torch.manual_seed(0)
q, k, v, ld = inputs(64)
o, _ = ula.linear_attention(q, k, v, ld, backend='torch'); o.backward(torch.ones_like(o))  # load code paths
q, k, v, ld = inputs({T})
base = status('VmRSS:')
open('/proc/self/clear_refs', 'w').write('5')
o, _ = ula.linear_attention(q, k, v, ld, backend='torch')
o.backward(torch.ones_like(o))
print((status('VmHWM:') - base) / 1024)
"""
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main():
    torch.manual_seed(0)
    T = 4096
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"# B={B} H={H} T={T} K={K} V={V}, vector decay, forward+backward")
    fwd_bwd("torch", 512)  # warm-up
    chunk = statistics.median(fwd_bwd("torch", T) for _ in range(5))
    ref = fwd_bwd("reference", T)
    print(f"chunk path (float32, chunk 64), median of 5: {chunk * 1e3:9.1f} ms")
    print(f"step-by-step reference (float64), one run:   {ref * 1e3:9.1f} ms")
    print(f"speed-up: {ref / chunk:.0f}x  (needs >= 20x)")

    mode = LargestTensor()
    q, k, v, ld = inputs(T)
    with mode:
        o, _ = ula.linear_attention(q, k, v, ld, backend="torch")
        o.backward(torch.ones_like(o))
    tkv = B * H * T * K * V
    print(f"largest tensor made in forward+backward: {mode.numel:,} elements ({mode.op}); "
          f"one [B,H,T,K,V] tensor would be {tkv:,} ({mode.numel / tkv:.3f} of it)")

    rows = []
    for t in (1024, 2048, 4096, 8192, 16384):
        mib = peak_rss_child(t)
        rows.append(dict(T=t, peak_rss_mib=round(mib, 1), tkv_mib=round(B * H * t * K * V * 4 / 2**20, 1)))
        print(f"T={t:6d}: peak extra resident memory {mib:8.1f} MiB   (a [T,K,V] float32 tensor per head set: {rows[-1]['tkv_mib']:8.1f} MiB)")
    print(json.dumps(dict(chunk_ms=chunk * 1e3, reference_ms=ref * 1e3, speedup=ref / chunk,
                          largest_tensor=mode.numel, tkv=tkv, memory=rows)))


if __name__ == "__main__":
    main()
