"""The compiled small LM against float64, tensor by tensor (session 33: with mamba2 and hgrn2 mixers the compiled
model's logits and gradients were up to 1.0e-1 and 1.8e-1 from eager's, the largest over tensors): for each mixer,
eager and compiled (Inductor) runs under bf16 autocast, each against the same model in float64 on the PyTorch path.
Prints the worst tensors of the compiled run beside eager's error on them and their share of the gradient norm, so
a gap can be told apart from bf16 rounding of a tensor whose gradient is tiny.
Run: PYTHONPATH=. python3 benchmarks/gpu_compile_lm_tensors.py [mixer ...]"""
import copy
import sys

import torch

from ula.layers import MIXERS
from ula.models import CausalLM, LMConfig
from compare import rel

dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the script


def run(model, ids, autocast, fn=None):
    """fn: what to call (the compiled model), model: whose parameters' gradients to read."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(dev, torch.bfloat16, enabled=autocast):
        logits = (model if fn is None else fn)(ids)[0]
    logits.double().logsumexp(-1).mean().backward()
    return {"logits": logits.detach().double()} | {n: p.grad.double() for n, p in model.named_parameters()}


def probe(mixer):
    torch.manual_seed(0)
    kw = {"gsa": dict(num_slots=8), "mamba2": dict(d_state=8)}.get(mixer, {})
    cfg = LMConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=2, mixer=mixer, mixer_kwargs=kw)
    model = CausalLM(cfg).to(dev)
    ids = torch.randint(0, 64, (2, 200), device=dev)
    ref_model = copy.deepcopy(model).double()
    for m in ref_model.modules():  # the float64 reference on the PyTorch path
        if hasattr(m, "backend"):
            m.backend = "torch"
    ref = run(ref_model, ids, False)
    eager = run(model, ids, True)
    torch._dynamo.reset()
    comp = run(model, ids, True, torch.compile(model))
    total = sum(r.norm() ** 2 for n, r in ref.items() if n != "logits").sqrt().item()
    rows = sorted(((rel(comp[n], r), rel(eager[n], r), r.norm().item() / total, n) for n, r in ref.items()),
                  reverse=True)
    worst_e = max(rel(eager[n], r) for n, r in ref.items())
    print(f"{mixer}: compiled worst {rows[0][0]:.1e}, eager worst {worst_e:.1e}", flush=True)
    for c, e, share, n in rows[:4]:
        print(f"    {n}: compiled {c:.1e} eager {e:.1e} (|grad| share {share:.1e})", flush=True)


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name() if dev == "cuda" else dev, flush=True)
    for mixer in sys.argv[1:] or ["mamba2", "hgrn2", "gla", "linear"]:
        try:
            probe(mixer)
        except Exception as e:
            print(f"{mixer}: FAILS {type(e).__name__}: {' '.join(str(e).split())[:400]}", flush=True)
