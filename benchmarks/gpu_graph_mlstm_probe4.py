"""Session 35: which cu_seqlens tensor the packed ones op (cudagraph_unsafe, run eagerly between Inductor's CUDA
graphs) sees in each call of packed mLSTMexp under mode="reduce-overhead", with the gate op inside the graphs:
every ula.core.cu_cache.cached lookup is printed with the tensor's id, data pointer, version, whether it hit, and
the values it holds now. Run: PYTHONPATH=.:benchmarks python3 benchmarks/gpu_graph_mlstm_probe4.py"""
import sys

import torch

import ula
from ula.core import capture, cu_cache
from ula.ops import _mlstm_gate_op as gate_op
from compare import rel

dev, T, H, K = "cuda", 256, 2, 32
torch.manual_seed(0)
q, k, v = (torch.randn(1, T, H, K, device=dev).bfloat16() for _ in range(3))
i, f = torch.randn(2, 1, T, H, device=dev)
BOUNDS = ([0, 100, T], [0, 100, T], [0, 30, T], [0, 200, T], [0, 100, T])
real_cached = cu_cache.cached


def traced(cu, key, build, on_device=True):
    entry = cu_cache._ENTRIES.get(id(cu))
    hit = entry is not None and entry[0]() is cu and entry[1] == cu_cache._version(cu) and key in entry[2]
    now = "capturing" if capture.capturing() else tuple(cu.tolist())
    name = key if isinstance(key, str) else key[0]
    print(f"   cached {name}: {'hit' if hit else 'miss'} id {id(cu)} ptr {cu.data_ptr()} version {cu._version} "
          f"holds {now}", flush=True)
    return real_cached(cu, key, build, on_device)


for mod in list(sys.modules.values()):
    if mod is not None and mod.__name__.startswith("ula") and getattr(mod, "cached", None) is real_cached:
        mod.cached = traced


print(torch.__version__, torch.cuda.get_device_name(), flush=True)
gate_op.gates_packed_fwd = gate_op.gates_fwd  # the packed gate op untagged (in the graphs)
step = lambda cu: ula.mlstm(q, k, v, i, f + 3, cu_seqlens=cu)[:1]  # noqa: E731
compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
for bounds in BOUNDS:
    cu = torch.tensor(bounds, device=dev, dtype=torch.int32)
    print(f"{bounds}: compiled call, cu id {id(cu)} ptr {cu.data_ptr()}", flush=True)
    got = [x.clone() for x in compiled(cu)]
    print(f"{bounds}: eager call", flush=True)
    ref = step(cu)
    print(f"{bounds}: " + " ".join(f"{rel(g, r):.1e}" for g, r in zip(got, ref)), flush=True)
