"""Decoding speed and memory of a 340M-shaped LM (issue 5): linear mixers against softmax attention.

    python3 benchmarks/gpu_decode.py [--cuda-graph] [--batch 1,8] [--quick] [--cpu-smoke] [--mixers gla,softmax]
                                     [--tokens 8192] [--eager auto|full|windows|none] [--budget-s 280]

Model: ula.models.CausalLM, d=1024, 24 layers, vocab 32000, SwiGLU, bf16 weights; mixers "gla" (4 heads,
paper 002's layer) and "softmax" (16 heads of 64, SDPA) by default, "mlstm_sig" (4 heads) or any other
ula.layers mixer with --mixers; one batch size or several (--batch 1,8). Each run prefills a short random
prompt with the chunk path, then decodes one greedy token per recurrent step.

Two ways of decoding, recorded side by side:
- "graph" (--cuda-graph): the step of `generate(..., cuda_graph=True)`, ula.models.cuda_graph.GraphedDecoder:
  states in a StaticStateCache updated in place, one step (embedding -> 24 layers -> logits) captured in a
  CUDA graph and replayed per token. Softmax attention decodes from a KV cache preallocated for the whole
  run, SDPA reading a bound >= the context (powers of two from 256, then the maximum) with a mask hiding
  the positions after it: one graph per bound. Both sides are graphed. Checked: its first 16 tokens against
  the eager loop's (exact for the linear mixers; softmax reads its cache through another SDPA kernel, so
  bf16 rounding may make a token differ), and once per mixer that generate(cuda_graph=True) captured
  without falling back to eager decoding.
- "eager": plain PyTorch, one Python step per token with the growing StateCache (softmax: a KV cache that
  grows by concatenation), launch-bound at batch 1 for every mixer alike. --eager full decodes the whole
  run this way (the default without --cuda-graph; slow: ~40 tokens/s); --eager windows (the default with
  --cuda-graph) times only the --window steps before each mark, from a prompt of mark - window tokens
  prefilled with the chunk path (the time of a step depends only on the context length), so the eager
  numbers cost seconds, not minutes; peak memory there is the prefill's, not recorded.

Recorded per (way, mixer, batch): tokens/s (batch x steps / s) over the window of --window steps ending at
each context length of --marks (512, 2048, 8192), and, for full runs, the peak memory since the start at
those points (torch.cuda.max_memory_allocated, reset before the prefill; weights and the captured graphs
included), the memory allocated then and the size of the cache (a static cache has its full size from the
start). The issue's bars: linear memory flat (peak at 8192 within 5% of peak at 512) and tokens/s at 8192 at
least 3x softmax (checked per way and batch). --quick decodes 2048 tokens (marks 512, 2048). The budget
(--budget-s, default 280 s) is shared out among the cases still to run; a full run that reaches its share
stops early (recorded). Writes $OUT/gpu_decode.json. Command for issue 5 on an H100 (about 300 s):
    python3 benchmarks/gpu_decode.py --cuda-graph --batch 1,8 --mixers gla,softmax --tokens 8192"""
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

from ula.bench.script import Run  # noqa: E402
from ula.models import CausalLM, LMConfig  # noqa: E402
from ula.models.cuda_graph import GraphedDecoder  # noqa: E402

HEADS = {"gla": 4, "mlstm_sig": 4, "mlstm_exp": 4, "softmax": 16}
CHECK_TOKENS = 16
WEIGHT = {"graph": 2.0, "full": 4.0, "windows": 1.0}   # shares of the budget per case


def add_args(ap):
    ap.add_argument("--mixers", default="gla,softmax", help="ula.layers mixers, e.g. gla,softmax,mlstm_sig")
    ap.add_argument("--batch", default="1", help="batch sizes, e.g. 1,8")
    ap.add_argument("--cuda-graph", action="store_true", help="decode with CUDA graphs (both sides)")
    ap.add_argument("--eager", default="auto", help="eager decoding: full, windows, none, or auto (windows with "
                    "--cuda-graph, full without; both in CPU smoke mode)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens to decode (default 8192, quick 2048)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt length (prefilled by the chunk path)")
    ap.add_argument("--window", type=int, default=256, help="decode steps per timing window")
    ap.add_argument("--marks", default=None, help="context lengths where windows end (default 512,2048,8192)")
    ap.add_argument("--min-bound", type=int, default=256, help="first bound of the static KV cache (softmax)")
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


def random_ids(run, cfg, B, T, seed=1):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, T), generator=gen).to(run.device)


@torch.no_grad()
def timed_decode(run, step, tok, P, n, marks, W, cache_mib, deadline):
    """n greedy steps from context P: step(tok [B]) -> logits [B, V]. At each mark (a context length) the
    tokens/s of the last W steps and the memory. Stops early (recorded) past the deadline (perf_counter)."""
    B = tok.shape[0]
    starts = {m - W: m for m in marks}
    t_start, at, first = {}, {}, [tok]
    ctx, stopped = P, None
    run.sync()
    t_all = time.perf_counter()
    while ctx < P + n:
        if ctx in starts:
            run.sync()
            t_start[starts[ctx]] = time.perf_counter()
        tok = step(tok).argmax(-1)
        ctx += 1
        if len(first) < CHECK_TOKENS:
            first.append(tok)
        if ctx in t_start:
            run.sync()
            dt = time.perf_counter() - t_start[ctx]
            at[ctx] = dict(context=ctx, tokens_per_s=B * W / dt, steps_per_s=W / dt, ms_per_step=dt / W * 1e3,
                           peak_mib=run.peak_mib(), allocated_mib=run.allocated_mib(), cache_mib=cache_mib())
            print(f"  context {ctx}: {B * W / dt:.1f} tokens/s, peak {at[ctx]['peak_mib']} MiB", flush=True)
        if ctx % 256 == 0 and time.perf_counter() > deadline:
            stopped = f"its share of the time budget ran out at context {ctx}"
            break
    run.sync()
    total = time.perf_counter() - t_all
    return dict(decoded=ctx - P, decode_s=total, mean_tokens_per_s=B * (ctx - P) / total,
                marks={str(k): v for k, v in at.items()}, stopped=stopped, final_cache_mib=cache_mib(),
                first_tokens=torch.stack(first, 1))


@torch.no_grad()
def full_case(run, model, cfg, B, graph, n, marks, W, deadline):
    """Prefill the prompt, then n steps: eager (growing StateCache) or graphed (GraphedDecoder)."""
    prompt = random_ids(run, cfg, B, run.args.prompt)
    P = prompt.shape[1]
    ref = model.generate(prompt, CHECK_TOKENS, greedy=True, cuda_graph=False)[:, P:]   # also the warm-up
    run.reset_peak()
    base = run.allocated_mib()
    run.sync()
    t0 = time.perf_counter()
    logits, cache = model(prompt)
    tok = logits[:, -1].argmax(-1)
    run.sync()
    out = dict(prefill_ms=(time.perf_counter() - t0) * 1e3, weights_mib=base)
    if graph:
        t0 = time.perf_counter()
        dec = GraphedDecoder(model, cache, P + n, capture=not run.smoke, min_bound=run.args.min_bound)
        run.sync()
        del cache
        out.update(capture_s=time.perf_counter() - t0, captured=dec.captured, graphs=len(dec.graphs),
                   bounds=dec.cache.bounds, static_max_len=dec.cache.max_len)
        step, cache_mib = dec, lambda: dec.cache.nbytes() / 2**20
    else:
        box = [cache]

        def step(t):
            logits, box[0] = model.step(t, box[0])
            return logits
        cache_mib = lambda: box[0].nbytes() / 2**20  # noqa: E731
    res = timed_decode(run, step, tok, P, n, marks, W, cache_mib, deadline)
    first = res.pop("first_tokens")
    k = min(first.shape[1], ref.shape[1])
    res["matches_eager"] = bool(torch.equal(first[:, :k], ref[:, :k]))
    res["first_tokens_equal"] = int((first[:, :k] == ref[:, :k]).all(0).long().cumprod(0).sum())
    out.update(res)
    return out


@torch.no_grad()
def generate_check(run, model, cfg):
    """generate(cuda_graph=True) captures (no fallback warning) and gives the tokens of the GraphedDecoder loop."""
    prompt = random_ids(run, cfg, 1, run.args.prompt, seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.generate(prompt, CHECK_TOKENS, greedy=True, cuda_graph=not run.smoke)
    fell_back = [str(w.message) for w in caught if "cuda_graph" in str(w.message)]
    eager = model.generate(prompt, CHECK_TOKENS, greedy=True, cuda_graph=False)
    return dict(generate_graph_fallback=fell_back[0][:400] if fell_back else None,
                generate_graph_equals_eager=bool(torch.equal(out, eager)))


@torch.no_grad()
def windows_case(run, model, cfg, B, marks, W, deadline):
    """Eager tokens/s at each mark from a prefill of mark - W tokens: W steps of the growing StateCache."""
    at, stopped = {}, None
    for m in marks:
        if time.perf_counter() > deadline:
            stopped = f"its share of the time budget ran out before context {m}"
            break
        logits, cache = model(random_ids(run, cfg, B, m - W, seed=m))
        tok = logits[:, -1].argmax(-1)
        del logits
        run.sync()
        t0 = time.perf_counter()
        for _ in range(W):
            logits, cache = model.step(tok, cache)
            tok = logits.argmax(-1)
        run.sync()
        dt = time.perf_counter() - t0
        at[str(m)] = dict(context=m, tokens_per_s=B * W / dt, steps_per_s=W / dt, ms_per_step=dt / W * 1e3,
                          cache_mib=cache.nbytes() / 2**20)
        print(f"  context {m}: {B * W / dt:.1f} tokens/s (eager window)", flush=True)
        del cache
    return dict(marks=at, stopped=stopped)


def body(run):
    a = run.args
    mixers = a.mixers.split(",")
    batches = [int(b) for b in a.batch.split(",")]
    n = a.tokens or (96 if run.smoke else 2048 if run.quick else 8192)
    W = 16 if run.smoke else a.window
    P = a.prompt if not run.smoke else 8
    run.args.prompt = P
    marks = [int(m) for m in a.marks.split(",")] if a.marks else ([32, 64, 96] if run.smoke else [512, 2048, 8192])
    marks = [m for m in marks if P + W <= m <= P + n]
    graph = a.cuda_graph or run.smoke
    eager = {"auto": ["full", "windows"] if run.smoke else ["windows"] if graph else ["full"], "none": []}.get(
        a.eager, a.eager.split(","))
    if set(eager) - {"full", "windows"}:
        raise SystemExit(f"--eager: full, windows, none or auto, got {a.eager!r}")
    ways = (["graph"] if graph else []) + eager
    run.meta.update(mixers=mixers, batches=batches, tokens=n, prompt=P, window=W, marks=marks, dtype="bfloat16",
                    ways=ways, sampling="greedy", min_bound=a.min_bound,
                    decoding={"graph": "StaticStateCache + one CUDA graph per bound, replayed per token" +
                              (" (CPU smoke: the same static steps, not captured)" if run.smoke else ""),
                              "full": "eager, growing StateCache, the whole run",
                              "windows": "eager, growing StateCache, --window steps after a prefill to each mark"})
    left = [(w, m, b) for m in mixers for b in batches for w in ways]
    for mixer in mixers:
        model, cfg = model_for(run, mixer)
        for B in batches:
            for way in ways:
                share = WEIGHT[way] / sum(WEIGHT[w] for w, _, _ in left)
                left.remove((way, mixer, B))
                deadline = time.perf_counter() + max(run.time_left(), 0) * share

                def fn(way=way, B=B):
                    if way == "windows":
                        return windows_case(run, model, cfg, B, marks, W, deadline)
                    return full_case(run, model, cfg, B, way == "graph", n, marks, W, deadline)
                run.case(way, mixer, fn, need_s=15, batch=B, params=model.num_parameters(), n_heads=cfg.n_heads)
        if graph:
            run.case("generate", mixer, lambda: generate_check(run, model, cfg), need_s=5)
        del model
    checks(run, mixers, batches, ways, marks)
    report(run)


def checks(run, mixers, batches, ways, marks):
    lo, hi = (marks[0], marks[-1]) if marks else (None, None)
    for way in ways:
        for B in batches:
            soft = run.get(way, "softmax", "marks", batch=B) or {}
            for mixer in [m for m in mixers if m != "softmax"]:
                mk = run.get(way, mixer, "marks", batch=B) or {}
                if way != "windows":
                    p_lo, p_hi = (mk.get(str(lo)) or {}).get("peak_mib"), (mk.get(str(hi)) or {}).get("peak_mib")
                    flat = None if p_lo is None or p_hi is None else round(p_hi / p_lo, 4)
                    run.check(f"{mixer} ({way}, batch {B}): peak memory at context {hi} / at {lo}", flat, "<= 1.05",
                              None if flat is None else flat <= 1.05)
                t, ts = (mk.get(str(hi)) or {}).get("tokens_per_s"), (soft.get(str(hi)) or {}).get("tokens_per_s")
                sp = None if t is None or ts is None else round(t / ts, 3)
                run.check(f"{mixer} / softmax tokens/s at context {hi} ({way}, batch {B})", sp, ">= 3",
                          None if sp is None else sp >= 3)


def report(run):
    rows = []
    for r in run.rows:
        if r["section"] == "generate":
            continue
        for m in (r.get("marks") or {}).values():
            rows.append(dict(way=r["section"], mixer=r["case"], batch=r["batch"], **m))
        if not r.get("marks"):
            rows.append(dict(way=r["section"], mixer=r["case"], error=r.get("error"), skipped=r.get("skipped")))
    run.print_table("decoding, bf16 (tokens/s = batch x steps/s)", rows,
                    ["way", "mixer", "batch", "context", "tokens_per_s", "ms_per_step", "peak_mib", "allocated_mib",
                     "cache_mib"], {"way": 8, "mixer": 10, "batch": 6})
    for r in run.rows:
        if r.get("error") or r.get("skipped"):
            continue
        if r["section"] == "generate":
            print(f"{r['case']}: generate(cuda_graph=True) fell back to eager: {r['generate_graph_fallback']}, "
                  f"equals eager generate: {r['generate_graph_equals_eager']}")
        elif r["section"] != "windows":
            extra = (f", capture {r['capture_s']:.1f} s ({r['graphs']} graphs)" if r["section"] == "graph" else "")
            print(f"{r['section']} {r['case']} batch {r['batch']}: {r['params'] / 1e6:.0f}M parameters, prefill "
                  f"{r['prefill_ms']:.1f} ms{extra}, {r['decoded']} steps in {r['decode_s']:.1f} s, first "
                  f"{CHECK_TOKENS} tokens equal eager's: {r['matches_eager']} ({r['first_tokens_equal']} equal)"
                  + (f", {r['stopped']}" if r.get("stopped") else ""))


def main():
    run = Run("gpu_decode", __doc__, add_args, budget=(280, 120))
    run.guarded(lambda: body(run))


if __name__ == "__main__":
    main()
