"""Packed mLSTMexp under torch.compile(mode="reduce-overhead") with boundaries that change between calls (session 34:
one replay 2.5e-1 from eager): which piece goes stale. Each case against the same call eager, per output. Since
session 35 the gate op is one untagged pair for both forms, so the last case is the default (the cause and the fix:
gpu_graph_mlstm_probe3.py and 4, results/graph_trees_cu_h100_session35.txt).
Run: PYTHONPATH=.:benchmarks python3 benchmarks/gpu_graph_mlstm_probe.py"""
import torch
import torch.nn.functional as F

import ula
from ula.ops import _mlstm_gate_op as gate_op
from ula.ops._mlstm_gate_kernels import mlstm_exp_gates
from compare import rel

dev, T, H, K = "cuda", 256, 2, 32
torch.manual_seed(0)
q, k, v = (torch.randn(1, T, H, K, device=dev).bfloat16() for _ in range(3))
i, f = torch.randn(2, 1, T, H, device=dev)
BOUNDS = ([0, 100, T], [0, 100, T], [0, 30, T], [0, 200, T], [0, 100, T], [0, 200, T], [0, 60, T])


def probe(name, step):
    torch._dynamo.reset()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for bounds in BOUNDS:
        cu = torch.tensor(bounds, device=dev, dtype=torch.int32)
        try:
            got = [x.clone() for x in compiled(cu)]
            ref = step(cu)
            print(f"{name} {bounds}: " + " ".join(f"{rel(g, r):.1e}" for g, r in zip(got, ref)), flush=True)
        except Exception as e:
            print(f"{name} {bounds}: FAILS {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)


print(torch.__version__, torch.cuda.get_device_name(), flush=True)
probe("gates", lambda cu: mlstm_exp_gates(i, f + 3, None, cu, torch.float32))
probe("core packed", lambda cu: ula.linear_attention(q, k, v, F.logsigmoid(f + 3).float(), cu_seqlens=cu)[:1])
probe("mlstm", lambda cu: ula.mlstm(q, k, v, i, f + 3, cu_seqlens=cu, output_final_state=True)[:1])
# the packed gate op untagged (in the graphs), as first written in session 34
gate_op.gates_packed_fwd = gate_op.gates_fwd
probe("mlstm, packed gates in the graphs", lambda cu: ula.mlstm(q, k, v, i, f + 3, cu_seqlens=cu)[:1])
