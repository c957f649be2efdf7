"""Session 35: packed mLSTMexp under mode="reduce-overhead" with its gate op inside Inductor's CUDA graphs (untagged):
which output goes wrong first. Returns the gates (a second call of the op), the output and the final states, each
against eager. Run: PYTHONPATH=.:benchmarks python3 benchmarks/gpu_graph_mlstm_probe3.py"""
import torch
import torch.nn.functional as F

import ula
from ula.ops import _mlstm_gate_op as gate_op
from ula.ops._mlstm_gate_kernels import mlstm_exp_gates
from compare import rel

dev, T, H, K = __import__("os").environ.get("DEV", "cuda"), 256, 2, 32
torch.manual_seed(0)
q, k, v = (torch.randn(1, T, H, K, device=dev).bfloat16() for _ in range(3))
i, f = torch.randn(2, 1, T, H, device=dev)
BOUNDS = ([0, 100, T], [0, 100, T], [0, 30, T], [0, 200, T], [0, 100, T], [0, 200, T], [0, 60, T])
NAMES = "ldp logw m mT o C|den n|S m_T|n".split()  # everything | ones_only


def probe(name, step):
    torch._dynamo.reset()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for bounds in BOUNDS:
        cu = torch.tensor(bounds, device=dev, dtype=torch.int32)
        got = [x.clone() for x in compiled(cu)]
        ref = step(cu)
        print(f"{name} {bounds}: " + " ".join(f"{n} {rel(g.double(), r.double()):.1e}"
                                               for n, g, r in zip(NAMES, got, ref)), flush=True)


def everything(cu):
    gates = mlstm_exp_gates(i, f + 3, None, cu, torch.float32)
    o, (C, n, m) = ula.mlstm(q, k, v, i, f + 3, cu_seqlens=cu, output_final_state=True)
    return [*gates, o, C, n, m]


def ones_only(cu):  # the core's column-of-ones call on fixed gates: no gate op at all
    from ula.core.ones import linear_attention_with_ones
    ld = F.logsigmoid(f + 3)
    o, den, fin = linear_attention_with_ones(q, k, v, ld, cu_seqlens=cu, output_final_state=True,
                                             key_gate=F.logsigmoid(i))
    return [ld, ld, ld, ld, o, den, *fin]


@torch.library.custom_op("probe::logsigmoid", mutates_args=())
def logsigmoid(x: torch.Tensor) -> torch.Tensor:  # a plain custom op, its output allocated by the op
    return F.logsigmoid(x)


@logsigmoid.register_fake
def _(x):
    return torch.empty_like(x)


def ones_custom(cu):  # ones_only with its decay and key gate from a trivial custom op inside the graphs
    from ula.core.ones import linear_attention_with_ones
    ld = logsigmoid(f + 3)
    o, den, fin = linear_attention_with_ones(q, k, v, ld, cu_seqlens=cu, output_final_state=True,
                                             key_gate=logsigmoid(i))
    return [ld, ld, ld, ld, o, den, *fin]


def core_custom(cu):  # the core's packed op alone, its decay from the trivial custom op
    ld = logsigmoid(f + 3)
    o, S = ula.linear_attention(q, k, v, ld, cu_seqlens=cu, output_final_state=True)
    return [ld, ld, ld, ld, o, S]


print(torch.__version__, torch.cuda.get_device_name(), flush=True)
probe("ones only", ones_only)
probe("ones, gates from a trivial custom op", ones_custom)
probe("core, decay from a trivial custom op", core_custom)
gate_op.gates_packed_fwd = gate_op.gates_fwd  # the packed gate op untagged (in the graphs)
probe("gates in the graphs", everything)
