"""Per-feature decays over more than 256 features on the GPU's compiled kernels, bf16 (session 38: such calls
now run in blocks of 256 features, ula/core/op.py `_run_split`; before, the kernels dropped the rest silently).

    python3 benchmarks/gpu_wide_decay.py

Relative error (Frobenius) of the output and every gradient against ula's PyTorch path in float64 on the same
bf16-rounded inputs, for GLA with K = 320 and 512, HGRN2 with K = 384, linear attention with a right decay over
V = 300, and GSA with m = 320 slots; the limit is the suite's bf16 one, 1e-2 (2e-2 for log-decay gradients).
Prints one JSON line per case and `all ok` or the failures."""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ula  # noqa: E402


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def case(name, fn, inputs, decays):
    do = torch.randn_like(fn(inputs, "torch").double())
    errs, res = {}, {}
    for side, dt, be in (("ref", torch.float64, "torch"), ("ours", torch.bfloat16, "triton")):
        x = {n: (t.to(dt) if n not in decays else t.double() if dt == torch.float64 else t.float())
             .detach().requires_grad_() for n, t in inputs.items()}
        o = fn(x, be)
        o.backward(do.to(o.dtype))
        res[side] = dict(o=o.detach(), **{"d" + n: t.grad for n, t in x.items()})
    for n, ref in res["ref"].items():
        errs[n] = rel(res["ours"][n], ref)
    ok = all(e <= (2e-2 if n[1:] in decays else 1e-2) for n, e in errs.items())
    print(json.dumps(dict(case=name, ok=ok, **{n: f"{e:.2e}" for n, e in errs.items()})), flush=True)
    return ok


def main():
    torch.manual_seed(0)
    dev, B, T, H = "cuda", 2, 1000, 2
    r = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    lg = lambda *s: F.logsigmoid(r(*s) + 3)  # noqa: E731
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                          triton=__import__("triton").__version__)))
    oks = []
    for K in (320, 512):
        x = dict(q=r(B, T, H, K) * K ** -0.5, k=r(B, T, H, K) * K ** -0.5, v=r(B, T, H, 64), g=lg(B, T, H, K))
        oks.append(case(f"gla K={K}", lambda x, be: ula.gla(x["q"], x["k"], x["v"], x["g"], backend=be)[0], x, ("g",)))
    x = dict(q=r(B, T, H, 384) * 384 ** -0.5, v=r(B, T, H, 64), g=lg(B, T, H, 384))
    oks.append(case("hgrn2 K=384", lambda x, be: ula.hgrn2(x["q"], x["v"], x["g"], backend=be)[0], x, ("g",)))
    x = dict(q=r(B, T, H, 64) * 0.125, k=r(B, T, H, 64) * 0.125, v=r(B, T, H, 300), rd=lg(B, T, H, 300))
    oks.append(case("linear rd V=300", lambda x, be: ula.linear_attention(x["q"], x["k"], x["v"], None, x["rd"],
                                                                            backend=be)[0], x, ("rd",)))
    x = dict(q=r(B, T, H, 64), k=r(B, T, H, 64), v=r(B, T, H, 64), g=lg(B, T, H, 320))
    oks.append(case("gsa m=320", lambda x, be: ula.gsa(x["q"], x["k"], x["v"], None, x["g"], backend=be)[0], x,
                    ("g",)))
    print("all ok" if all(oks) else "FAILED")


if __name__ == "__main__":
    main()
