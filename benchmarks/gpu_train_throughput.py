"""Training throughput of the GLA language model (issue 5): ula's GLA op against fla's, same model, same run.

    python3 benchmarks/gpu_train_throughput.py [--quick] [--cpu-smoke] [--impls ours,fla] [--seq 8192]

Model: ula.models.CausalLM with the GLA mixer (paper 002's layer: d_k = d/2, d_v = d, 4 heads, so the op
runs at H=4 K=128 V=256), d=1024, 24 layers, vocab 32000 (368M parameters), batch 1 x T=8192 tokens,
float32 weights, bf16 autocast, AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1), cross-entropy on
random tokens. "fla": the same model, the same initial weights (one state dict loaded into both), the
same batches, with the GLA layer's core op (`ula.layers.gla.gla`) replaced by fla.ops.gla.chunk_gla
(same q, k, v, log forget gate g, scale, initial / final state); nothing else changes. The loss and the
gradient norm of the first step (before any update) must agree; their relative differences are recorded.

Timing: --warmup steps (the first compiles ours and autotunes fla's kernels, ~2 min for fla), then the
median of --steps steps, each synchronized; tokens/s = batch * T / median step time; peak memory of the
timed steps. Writes $OUT/gpu_train_throughput.json."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ula.layers.gla as gla_layer  # noqa: E402
from ula.bench.script import Run  # noqa: E402
from ula.models import CausalLM, LMConfig  # noqa: E402


def add_args(ap):
    ap.add_argument("--impls", default="ours,fla", help="ours and / or fla")
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10, quick 5)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3, quick 2)")
    ap.add_argument("--lr", type=float, default=3e-4)


def fla_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, **_):
    """ula.gla's signature on fla's chunk_gla (chunk_size, backend: ours only, ignored)."""
    from fla.ops.gla import chunk_gla
    return chunk_gla(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                     cu_seqlens=cu_seqlens)


def config(run):
    a = run.args
    if run.smoke:
        return LMConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=2, mixer="gla"), 1, 128
    return LMConfig(vocab_size=a.vocab, d_model=a.d_model, n_layers=a.layers, n_heads=a.heads, mixer="gla"), \
        a.batch, a.seq


def train(run, impl, cfg, init, batches, warmup, steps):
    """warmup + steps AdamW steps of a fresh model holding `init`; the GLA op is fla's for impl 'fla'."""
    orig = gla_layer.gla
    if impl == "fla":
        from fla.ops.gla import chunk_gla  # noqa: F401  (fail here, before any work, when fla is missing)
        gla_layer.gla = fla_gla
    try:
        model = CausalLM(cfg)
        model.load_state_dict(init)
        model.to(run.device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=run.args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        losses, times, first_grad_norm = [], [], None
        for i in range(warmup + steps):
            if i == warmup:
                run.reset_peak()
            ids = batches[i].to(run.device)
            run.sync()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(run.device.type, dtype=torch.bfloat16):
                logits, _ = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
            loss.backward()
            if i == 0:
                first_grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
            opt.step()
            run.sync()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            print(f"  {impl} step {i}: loss {losses[-1]:.4f}, {times[-1] * 1e3:.0f} ms", flush=True)
            if i >= warmup and run.time_left() < 2:
                break
        timed = times[warmup:]
        B, T = batches[0].shape[0], batches[0].shape[1] - 1
        med = statistics.median(timed) if timed else None
        return dict(first_loss=losses[0], first_grad_norm=first_grad_norm, losses=losses,
                    step_ms=[t * 1e3 for t in times], warmup_steps=warmup, timed_steps=len(timed),
                    median_step_ms=None if med is None else med * 1e3,
                    tokens_per_s=None if med is None else B * T / med, peak_mib=run.peak_mib(),
                    params=model.num_parameters())
    finally:
        gla_layer.gla = orig


def body(run):
    a = run.args
    cfg, B, T = config(run)
    steps = 2 if run.smoke else a.steps or (5 if run.quick else 10)
    warmup = 1 if run.smoke else a.warmup or (2 if run.quick else 3)
    impls = a.impls.split(",")
    torch.manual_seed(0)
    init = {k: v.clone() for k, v in CausalLM(cfg).state_dict().items()}
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen) for _ in range(warmup + steps)]
    H = cfg.n_heads
    run.meta.update(config=cfg.to_dict(), batch=B, seq=T, steps=steps, warmup=warmup, impls=impls,
                    autocast="bfloat16", optimizer="AdamW",
                    op_shape=f"H{H}_K{cfg.d_model // 2 // H}_V{cfg.d_model // H}")
    if run.smoke and "fla" in impls:
        run.note("fla is a GPU kernel: the fla model is skipped in CPU smoke mode")
        impls = [i for i in impls if i != "fla"]
    for impl in impls:
        run.case("train", impl, lambda impl=impl: train(run, impl, cfg, init, batches, warmup, steps),
                 need_s=200 if impl == "fla" else 60)
    o, f = run.select("train", case="ours"), run.select("train", case="fla")
    if o and f:
        o, f = o[0], f[0]
        dl = abs(o["first_loss"] - f["first_loss"]) / abs(f["first_loss"])
        dg = abs(o["first_grad_norm"] - f["first_grad_norm"]) / abs(f["first_grad_norm"])
        run.check("first-step loss, ours vs fla (relative difference)", round(dl, 6), "<= 1e-2", dl <= 1e-2)
        run.check("first-step gradient norm, ours vs fla (relative difference)", round(dg, 6), "<= 5e-2 (info)",
                  dg <= 5e-2)
        r = o["tokens_per_s"] / f["tokens_per_s"] if o["tokens_per_s"] and f["tokens_per_s"] else None
        run.check(f"training tokens/s at T={T}, ours / fla", None if r is None else round(r, 3), ">= 1",
                  None if r is None else r >= 1)
    else:
        run.check(f"training tokens/s at T={T}, ours / fla", None, ">= 1", None)
    run.print_table(f"training, GLA LM, B={B} T={T}, bf16 autocast, AdamW", run.rows,
                    ["case", "params", "first_loss", "first_grad_norm", "median_step_ms", "tokens_per_s", "peak_mib",
                     "timed_steps"], {"case": 8, "first_grad_norm": 16})


def main():
    run = Run("gpu_train_throughput", __doc__, add_args, budget=(420, 240))
    run.guarded(lambda: body(run))


if __name__ == "__main__":
    main()
