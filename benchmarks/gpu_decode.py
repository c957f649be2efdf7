"""Decoding speed and memory of a 340M-shaped LM (issue 5): linear mixers against softmax attention.

    python3 benchmarks/gpu_decode.py [--quick] [--cpu-smoke] [--mixers gla,softmax] [--tokens 8192]

Model: ula.models.CausalLM, d=1024, 24 layers, vocab 32000, SwiGLU, bf16 weights, batch 1; mixers "gla"
(4 heads, paper 002's layer) and "softmax" (16 heads of 64, SDPA, KV cache that grows with the context)
by default, "mlstm_sig" (4 heads) or any other ula.layers mixer with --mixers. Prefill a short random prompt with the chunk path, then decode one greedy token
per recurrent step, the loop of CausalLM.generate (checked: its first tokens equal generate's). ula's
generate has no CUDA-graph or torch.compile path, so decoding is plain eager PyTorch: one Python step per
token, launch-bound at batch 1 for every mixer alike.

Recorded per mixer: tokens/s over the window of --window steps ending at each context length of --marks
(512, 2048, 8192), and at those points the peak memory since the start (torch.cuda.max_memory_allocated,
reset before the prefill; weights included), the memory allocated then and the size of the cache.
The issue's bars: linear memory flat (peak at 8192 within 5% of peak at 512) and tokens/s at 8192 at
least 3x softmax. --quick decodes 2048 tokens (marks 512, 2048). Writes $OUT/gpu_decode.json."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

from ula.bench.script import Run  # noqa: E402
from ula.models import CausalLM, LMConfig  # noqa: E402

HEADS = {"gla": 4, "mlstm_sig": 4, "mlstm_exp": 4, "softmax": 16}


def add_args(ap):
    ap.add_argument("--mixers", default="gla,softmax", help="ula.layers mixers, e.g. gla,softmax,mlstm_sig")
    ap.add_argument("--tokens", type=int, default=None, help="tokens to decode (default 8192, quick 2048)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt length (prefilled by the chunk path)")
    ap.add_argument("--window", type=int, default=256, help="decode steps per timing window")
    ap.add_argument("--marks", default=None, help="context lengths where windows end (default 512,2048,8192)")
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=32000)


def model_for(run, mixer):
    a = run.args
    if run.smoke:
        cfg = LMConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=2, mixer=mixer)
    else:
        cfg = LMConfig(vocab_size=a.vocab, d_model=a.d_model, n_layers=a.layers, n_heads=HEADS.get(mixer, 4),
                       mixer=mixer)
    torch.manual_seed(0)
    return CausalLM(cfg).to(device=run.device, dtype=run.dtype).eval(), cfg


@torch.no_grad()
def check_generate(model, prompt, n=16):
    """Our loop's first n tokens equal CausalLM.generate's (greedy)."""
    ref = model.generate(prompt, n, greedy=True)[0, prompt.shape[1]:]
    logits, cache = model(prompt)
    tok = logits[:, -1].argmax(-1)
    toks = [tok]
    for _ in range(n - 1):
        logits, cache = model.step(tok, cache)
        tok = logits.argmax(-1)
        toks.append(tok)
    return bool(torch.equal(torch.stack(toks, 1)[0], ref))


@torch.no_grad()
def decode(run, model, prompt, n, marks, W):
    """Prefill, then n greedy steps; at each mark (a context length) the tokens/s of the last W steps and the
    memory. Stops early (recorded) when the time budget runs out."""
    P = prompt.shape[1]
    starts = {m - W: m for m in marks}
    t_start, at = {}, {}
    run.reset_peak()
    base = run.allocated_mib()
    run.sync()
    t0 = time.perf_counter()
    logits, cache = model(prompt)
    tok = logits[:, -1].argmax(-1)
    run.sync()
    prefill_ms = (time.perf_counter() - t0) * 1e3
    ctx, stopped = P, None
    t_all = time.perf_counter()
    while ctx < P + n:
        if ctx in starts:
            run.sync()
            t_start[starts[ctx]] = time.perf_counter()
        logits, cache = model.step(tok, cache)
        tok = logits.argmax(-1)
        ctx += 1
        if ctx in t_start:
            run.sync()
            dt = time.perf_counter() - t_start[ctx]
            at[ctx] = dict(context=ctx, tokens_per_s=W / dt, ms_per_token=dt / W * 1e3, peak_mib=run.peak_mib(),
                           allocated_mib=run.allocated_mib(), cache_mib=cache.nbytes() / 2**20)
            print(f"  context {ctx}: {W / dt:.1f} tokens/s, peak {at[ctx]['peak_mib']} MiB", flush=True)
        if ctx % 256 == 0 and run.time_left() < 3:
            stopped = f"time budget ran out at context {ctx}"
            break
    run.sync()
    total = time.perf_counter() - t_all
    return dict(prefill_ms=prefill_ms, decoded=ctx - P, decode_s=total, mean_tokens_per_s=(ctx - P) / total,
                weights_mib=base, marks={str(k): v for k, v in at.items()}, stopped=stopped,
                final_cache_mib=cache.nbytes() / 2**20, last_token=int(tok[0]))


def mixer_case(run, mixer, n, marks, W):
    model, cfg = model_for(run, mixer)
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (1, run.args.prompt), generator=gen).to(run.device)
    same = check_generate(model, prompt)  # also the warm-up: compiles the prefill's kernels
    res = decode(run, model, prompt, n, marks, W)
    res.update(matches_generate=same, params=model.num_parameters(), n_heads=cfg.n_heads, d_model=cfg.d_model,
               layers=cfg.n_layers, vocab=cfg.vocab_size)
    del model
    return res


def body(run):
    a = run.args
    mixers = a.mixers.split(",")
    n = a.tokens or (96 if run.smoke else 2048 if run.quick else 8192)
    W = 16 if run.smoke else a.window
    P = a.prompt if not run.smoke else 8
    run.args.prompt = P
    marks = [int(m) for m in a.marks.split(",")] if a.marks else ([32, 64, 96] if run.smoke else [512, 2048, 8192])
    marks = [m for m in marks if P + W <= m <= P + n]
    run.meta.update(mixers=mixers, tokens=n, prompt=P, window=W, marks=marks, batch=1, dtype="bfloat16",
                    decoding="eager (ula's generate has no CUDA-graph / torch.compile path)", sampling="greedy")
    for mixer in mixers:
        run.case("decode", mixer, lambda mixer=mixer: mixer_case(run, mixer, n, marks, W), need_s=30)
    lo, hi = (marks[0], marks[-1]) if marks else (None, None)
    soft = run.get("decode", "softmax", "marks") or {}
    for mixer in [m for m in mixers if m != "softmax"]:
        mk = run.get("decode", mixer, "marks") or {}
        p_lo, p_hi = (mk.get(str(lo)) or {}).get("peak_mib"), (mk.get(str(hi)) or {}).get("peak_mib")
        flat = None if p_lo is None or p_hi is None else round(p_hi / p_lo, 4)
        run.check(f"{mixer}: peak memory at context {hi} / at {lo}", flat, "<= 1.05",
                  None if flat is None else flat <= 1.05)
        t, ts = (mk.get(str(hi)) or {}).get("tokens_per_s"), (soft.get(str(hi)) or {}).get("tokens_per_s")
        sp = None if t is None or ts is None else round(t / ts, 3)
        run.check(f"{mixer} / softmax tokens/s at context {hi}", sp, ">= 3", None if sp is None else sp >= 3)
    rows = []
    for r in run.rows:
        for m in (r.get("marks") or {}).values():
            rows.append(dict(mixer=r["case"], **m))
        if not r.get("marks"):
            rows.append(dict(mixer=r["case"], error=r.get("error"), skipped=r.get("skipped")))
    run.print_table("decoding, batch 1, bf16", rows, ["mixer", "context", "tokens_per_s", "ms_per_token", "peak_mib",
                                                      "allocated_mib", "cache_mib"], {"mixer": 10})
    for r in run.select("decode"):
        print(f"{r['case']}: {r['params'] / 1e6:.0f}M parameters, prefill {r['prefill_ms']:.1f} ms, "
              f"{r['decoded']} tokens in {r['decode_s']:.1f} s, matches generate: {r['matches_generate']}"
              + (f", {r['stopped']}" if r.get("stopped") else ""))


def main():
    run = Run("gpu_decode", __doc__, add_args, budget=(330, 120))
    run.guarded(lambda: body(run))


if __name__ == "__main__":
    main()
