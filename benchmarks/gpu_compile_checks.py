"""torch.compile on the GPU, case by case, each against the same call eager (forward output and gradients, max
relative error), one line per case with the error a user would see where it fails:
- the core (no, scalar and vector decay; packed) and each family op, torch.compile(fullgraph=True);
- a small language model with each mixer, torch.compile (default backend, Inductor), forward and backward;
- packed calls of the core, mLSTMexp, normalized attention and ABC, and the core with cu_seqlens also used inside
  the graph, under mode="reduce-overhead" (Inductor's CUDA graphs) and the default mode, output and gradients, with
  cu_seqlens a graph input whose boundaries change between steps at a fixed T: a CUDA graph replays the layout of
  its capture, so a replay with other boundaries would be silently wrong (since session 34 their ops run outside
  the graphs, since session 35 reading cu_seqlens afresh: ula/core/custom_ops.py).
Run: PYTHONPATH=. python3 benchmarks/gpu_compile_checks.py [--parts ops,lm,graphs] [--graph-steps a,b] [--stale]"""
import argparse

import torch
import torch.nn.functional as F

import ula
from ula.layers import MIXERS
from ula.models import CausalLM, LMConfig
from compare import rel

dev = "cuda"
T, H, K = 256, 2, 32


def leaves(*shapes, dt=torch.bfloat16):
    return [torch.randn(*s, device=dev).to(dt).requires_grad_() for s in shapes]


def ops():
    q, k, v = leaves(*[(1, T, H, K)] * 3)
    g_s, g_v, i, f = (x.detach().float().requires_grad_() for x in leaves((1, T, H), (1, T, H, K), (1, T, H),
                                                                          (1, T, H)))
    slots = leaves((1, T, H, 8), dt=torch.float32)[0]
    cu = torch.tensor([0, 100, T], device=dev, dtype=torch.int32)
    ls, lv = F.logsigmoid(g_s + 3), F.logsigmoid(g_v + 3)
    return {
        "core none": (lambda: ula.linear_attention(q, k, v)[0], [q, k, v]),
        "core scalar": (lambda: ula.linear_attention(q, k, v, F.logsigmoid(g_s + 3))[0], [q, k, v, g_s]),
        "core vector": (lambda: ula.linear_attention(q, k, v, F.logsigmoid(g_v + 3))[0], [q, k, v, g_v]),
        "core scalar packed": (lambda: ula.linear_attention(q, k, v, F.logsigmoid(g_s + 3), cu_seqlens=cu)[0],
                               [q, k, v, g_s]),
        "gla": (lambda: ula.gla(q, k, v, F.logsigmoid(g_v + 3))[0], [q, k, v, g_v]),
        "mlstm exp": (lambda: ula.mlstm(q, k, v, i, f + 3)[0], [q, k, v, i, f]),
        "mlstm sig": (lambda: ula.mlstm(q, k, v, i, f + 3, variant="sig")[0], [q, k, v, i, f]),
        "normalized": (lambda: ula.normalized_linear_attention(q, k, v)[0], [q, k, v]),
        "gsa": (lambda: ula.gsa(q, k, v, slots, F.logsigmoid(slots + 3))[0], [q, k, v, slots]),
    }, (ls, lv)


def check(name, fn, args, compiled_fn):
    def run(f):
        for a in args:
            a.grad = None
        out = f()
        out.float().square().mean().backward()
        return [out.detach().clone()] + [a.grad.clone() for a in args]
    try:
        ref = run(fn)
        got = run(compiled_fn)
        print(f"{name}: ok, max rel err {max(rel(g, r) for g, r in zip(got, ref)):.1e}", flush=True)
    except Exception as e:
        print(f"{name}: FAILS {type(e).__name__}: {' '.join(str(e).split())[:500]}", flush=True)


def part_ops():
    cases, _ = ops()
    for name, (fn, args) in cases.items():
        torch._dynamo.reset()
        check(f"fullgraph {name}", fn, args, torch.compile(fn, fullgraph=True))


def part_lm():
    for mixer in MIXERS:
        torch._dynamo.reset()
        torch.manual_seed(0)
        kw = {"gsa": dict(num_slots=8), "mamba2": dict(d_state=8)}.get(mixer, {})
        m = CausalLM(LMConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=2, mixer=mixer, mixer_kwargs=kw)).to(dev)
        ids = torch.randint(0, 64, (2, 200), device=dev)
        cm = torch.compile(m)
        params = list(m.parameters())
        with torch.autocast("cuda", torch.bfloat16):
            check(f"lm {mixer}", lambda: m(ids)[0], params, lambda: cm(ids)[0])


def _with_grads(fn, cu, xs):
    out = fn(cu)
    return [out.detach().clone()] + [g.clone() for g in torch.autograd.grad(out.float().square().sum(), xs)]


def part_graphs(only=None):
    q, k, v = leaves(*[(1, T, H, K)] * 3)
    ld = F.logsigmoid(torch.randn(1, T, H, device=dev) + 3)
    i, f = torch.randn(2, 1, T, H, device=dev)
    w = torch.randn(1, T, H, 8, device=dev)
    steps = {"core": lambda cu, q, k, v: ula.linear_attention(q, k, v, ld, cu_seqlens=cu)[0],
             "mlstm exp": lambda cu, q, k, v: ula.mlstm(q, k, v, i, f + 3, cu_seqlens=cu)[0],
             "normalized": lambda cu, q, k, v: ula.normalized_linear_attention(q, k, v, cu_seqlens=cu)[0],
             # cu_seqlens consumed inside a graph too (ABC's softmax scan; a user's op): the ops between graphs then
             # get the graph's copy of it, rewritten at every call without a version bump (session 35)
             "abc": lambda cu, q, k, v: ula.abc(q, k, v, w, cu_seqlens=cu)[0],
             "core+cu in the graph": lambda cu, q, k, v: ula.linear_attention(q, k, v, ld, cu_seqlens=cu)[0]
             + (cu[-1] - T)}
    # where compiled and eager differ (Inductor fuses the PyTorch ops between ours and rounds them once), both are
    # set against the same call in float32: the compiled call must be no further from it than eager
    qkv32 = [x.detach().float().requires_grad_() for x in (q, k, v)]
    for mode in ("reduce-overhead", "default"):
        for name, step in steps.items():
            if only and name not in only:
                continue
            torch._dynamo.reset()
            compiled = torch.compile(step, mode=mode, fullgraph=True)
            for bounds in ([0, 100, T], [0, 100, T], [0, 30, T], [0, 200, T], [0, 30, 90, T], [0, 100, T]):
                cu = torch.tensor(bounds, device=dev, dtype=torch.int32)
                try:  # the output and the gradients of q, k, v (the backward replays graphs too)
                    got = _with_grads(lambda c: compiled(c, q, k, v), cu, (q, k, v))
                    ref = _with_grads(lambda c: step(c, q, k, v), cu, (q, k, v))
                    err = max(rel(a, b) for a, b in zip(got, ref))
                    line = f"{mode} {name} {bounds}: rel err against eager {err:.1e}"
                    if err > 0:
                        f32 = _with_grads(lambda c: step(c, *qkv32), cu, qkv32)
                        line += (f"; against float32: compiled {max(rel(a, b) for a, b in zip(got, f32)):.1e}, "
                                 f"eager {max(rel(a, b) for a, b in zip(ref, f32)):.1e}")
                    print(line, flush=True)
                except Exception as e:
                    print(f"{mode} {name} {bounds}: FAILS {type(e).__name__}: {' '.join(str(e).split())[:500]}",
                          flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="ops,lm,graphs")
    ap.add_argument("--graph-steps", default="", help="graphs: only these steps (comma-separated names)")
    ap.add_argument("--stale", action="store_true", help="graphs: ops between graphs trust the cache (before "
                    "session 35's fix), to show what it fixed")
    a = ap.parse_args()
    want = a.parts.split(",")
    if a.stale:
        from ula.core import custom_ops
        custom_ops.graph_trees_in_use = lambda: False
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for part in want:
        print(f"### {part}", flush=True)
        if part == "graphs":
            part_graphs([x for x in a.graph_steps.split(",") if x])
        else:
            {"ops": part_ops, "lm": part_lm}[part]()
