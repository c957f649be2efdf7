"""`ula demo`: train a small 2-layer model per mixer on MQAR and compare recall at equal width.

Every mixer gets the same width, heads, depth, data, steps and optimizer. The mixers whose state size
is set by a width other than d_model get the keyword that makes it about the state of plain linear
attention (H · d_head² numbers per layer): GLA expand_k = 1, mLSTM qk_ratio = 1, GSA d_head/2 slots
(two passes, each d_head × slots)."""
import json
import math
import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..train.errors import ConfigError
from ..train.files import atomic_path, check_out_dir
from .model import demo_model
from .mqar import IGNORE, accuracy, mqar_batch

DEMO_MIXERS = ("linear", "retnet", "gla", "mlstm_sig", "mlstm_exp", "gsa", "normalized", "softmax")
LABELS = {"linear": "linear attn", "retnet": "RetNet", "gla": "GLA", "mlstm_sig": "mLSTM sig",
          "mlstm_exp": "mLSTM exp", "gsa": "GSA", "normalized": "normalized LA", "softmax": "softmax (SDPA)"}


@dataclass
class DemoConfig:
    mixers: tuple = DEMO_MIXERS
    # Defaults (issue 6: gated mixers above plain linear attention at equal state, softmax near 100 %, in
    # <= 10 min on a 2-core CPU; probes in benchmarks/demo_cpu.txt). At 8 pairs, T = 32, vocab 64 and no
    # prefix every mixer reaches ~100 %; MQAR alone holds nothing a gate would need to forget, and longer T,
    # random filler (Zoology's random_non_queries) or more pairs per head made plain linear attention learn
    # faster than the gated mixers, not slower. What separates them is a past to forget: 32 random tokens
    # before the pairs (`prefix`), from a vocabulary of 20 (keys from 9 ids), so most keys also occur in the
    # prefix followed by some other token, a stale binding. A decaying state (RetNet, GLA, GSA, mLSTM)
    # forgets it before the queries, softmax attention (RoPE) can prefer the later binding, plain linear
    # attention keeps both at equal weight.
    num_kv: int = 8
    seq_len: int | None = None       # None: prefix + 4 * num_kv
    vocab_size: int = 20
    d_model: int = 64
    n_heads: int = 2
    n_layers: int = 2
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    seeds: tuple = (0,)
    eval_size: int = 512
    shift: bool = True
    init_std: float | None = None    # None: d_model^-1/2
    log_every: int = 10
    noise: bool = False              # random tokens instead of the filler 0 after the context (mqar.py)
    prefix: int = 32                 # random tokens before the pairs, counted in seq_len (mqar.py)

    @property
    def T(self):
        return self.seq_len or self.prefix + 4 * self.num_kv


TINY = dict(mixers=("linear", "gla", "softmax"), num_kv=2, vocab_size=16, d_model=16, n_heads=2, steps=4,
            batch_size=8, eval_size=16, warmup=2, log_every=1, prefix=4)


def mixer_kwargs(name, d_model, n_heads):
    d_head = d_model // n_heads
    return {"gla": dict(expand_k=1.0), "mlstm_sig": dict(qk_ratio=1.0), "mlstm_exp": dict(qk_ratio=1.0),
            "gsa": dict(num_slots=max(1, d_head // 2))}.get(name, {})


@torch.no_grad()
def state_numbers(model, T, device):
    """Numbers in the state each sequence carries after T tokens, all layers (softmax: its KV cache)."""
    _, cache = model(torch.zeros(1, T, dtype=torch.long, device=device))
    return cache.numel()


def lr_at(step, cfg):
    warm = min(1.0, (step + 1) / max(1, cfg.warmup))
    return cfg.lr * warm * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))


@torch.no_grad()
def evaluate(model, cfg, seed, device):
    g = torch.Generator().manual_seed(10_000 + seed)
    hit = tot = 0
    for i in range(0, cfg.eval_size, 256):
        x, y = mqar_batch(min(256, cfg.eval_size - i), cfg.num_kv, cfg.vocab_size, cfg.T, g, device, cfg.noise,
                          cfg.prefix)
        h, n = accuracy(model(x)[0], y)
        hit, tot = hit + h, tot + n
    return hit / tot


def train_one(name, cfg, seed, device, bar=True):
    torch.manual_seed(seed)
    model = demo_model(name, cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads,
                       mixer_kwargs(name, cfg.d_model, cfg.n_heads), cfg.shift, cfg.init_std).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(seed)          # the same sequences for every mixer
    curve, t0 = [], time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=f"{LABELS.get(name, name):<15}", leave=True, dynamic_ncols=True,
               mininterval=1.0, disable=not bar)
    for step in bar:
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, cfg)
        x, y = mqar_batch(cfg.batch_size, cfg.num_kv, cfg.vocab_size, cfg.T, g, device, cfg.noise, cfg.prefix)
        logits, _ = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            curve.append((step, loss.item()))
            bar.set_postfix(loss=f"{curve[-1][1]:.3f}", refresh=False)
    model.eval()
    acc = evaluate(model, cfg, seed, device)
    bar.set_postfix(loss=f"{curve[-1][1]:.3f}", acc=f"{acc:.3f}")
    bar.close()
    return dict(seed=seed, accuracy=acc, final_loss=curve[-1][1], seconds=time.perf_counter() - t0,
                loss_curve=curve, params=sum(p.numel() for p in model.parameters()),
                state_numbers=state_numbers(model, cfg.T, device))


def check_config(cfg):
    """Raises ConfigError, naming the field, for a config the demo cannot run; builds every mixer's
    model once (cheap) so that a width the mixer cannot split fails before any training."""
    from ..layers import MIXERS
    ints = dict(num_kv=1, vocab_size=1, d_model=1, n_heads=1, n_layers=1, steps=1, batch_size=1, eval_size=1,
                log_every=1, warmup=0, prefix=0)
    for k, lo in ints.items():
        v = getattr(cfg, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"DemoConfig.{k} must be an integer >= {lo}, got {v!r}")
    for k, ok, need in (("lr", lambda v: v > 0, "> 0"), ("weight_decay", lambda v: v >= 0, ">= 0")):
        v = getattr(cfg, k)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
            raise ConfigError(f"DemoConfig.{k} must be a finite number {need}, got {v!r}")
    if not cfg.seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in cfg.seeds):
        raise ConfigError(f"DemoConfig.seeds must be one or more integers >= 0, got {cfg.seeds!r}")
    bad = [m for m in cfg.mixers if m not in MIXERS]
    if not cfg.mixers or bad:
        raise ConfigError(f"DemoConfig.mixers must be one or more of {sorted(MIXERS)}, got {list(cfg.mixers)!r}")
    try:
        mqar_batch(1, cfg.num_kv, cfg.vocab_size, cfg.T, noise=cfg.noise, prefix=cfg.prefix)
    except ValueError as e:
        raise ConfigError(f"{e} (--num-kv, --vocab-size, --seq-len)") from e
    for m in cfg.mixers:
        try:
            demo_model(m, cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads,
                       mixer_kwargs(m, cfg.d_model, cfg.n_heads), cfg.shift, cfg.init_std)
        except ValueError as e:
            raise ConfigError(f"mixer {m} with d_model (--d-model) {cfg.d_model} and n_heads (--heads) "
                              f"{cfg.n_heads} makes no model: {e}") from e


def _job(name, cfg, seed, device, threads):
    """One (mixer, seed) in a worker process (CPU): one thread each, no per-step bar."""
    torch.set_num_threads(threads)
    return name, train_one(name, cfg, seed, device, bar=False)


def run_demo(cfg: DemoConfig, out_dir, device="cpu", jobs=1):
    """Trains every mixer of cfg for every seed (`jobs` worker processes train different mixers side by
    side: on a CPU one thread each; on a GPU they share it, small models being launch-bound); writes
    results.json and mqar.png into out_dir and returns the results dict. The config and out_dir are checked
    before any training; the two files are written whole or not at all (a former one is left as it was)."""
    check_config(cfg)
    check_out_dir(out_dir)
    t0 = time.perf_counter()
    todo = [(n, s) for n in cfg.mixers for s in cfg.seeds]
    done = {}
    if jobs > 1 and len(todo) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed
        ctx = mp.get_context("fork" if torch.device(device).type == "cpu" else "spawn")   # CUDA: no fork
        with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=ctx) as ex:
            futs = [ex.submit(_job, n, cfg, s, str(device), 1) for n, s in todo]
            with tqdm(total=len(futs), desc="mixers", unit="model", dynamic_ncols=True) as bar:
                for f in as_completed(futs):
                    n, r = f.result()
                    done[n, r["seed"]] = r
                    bar.write(f"{LABELS.get(n, n):<15} seed {r['seed']}: accuracy {100 * r['accuracy']:5.1f} %, "
                              f"loss {r['final_loss']:.3f}, {r['seconds']:.0f} s")
                    bar.update(1)
    else:
        for n, s in todo:
            done[n, s] = train_one(n, cfg, s, device)
    rows = []
    for name in cfg.mixers:
        runs = [done[name, s] for s in cfg.seeds]
        accs = [r["accuracy"] for r in runs]
        rows.append(dict(mixer=name, label=LABELS.get(name, name), accuracy=sum(accs) / len(accs),
                         accuracy_min=min(accs), accuracy_max=max(accs), state_numbers=runs[0]["state_numbers"],
                         state_grows_with_T=name == "softmax", params=runs[0]["params"],
                         seconds=sum(r["seconds"] for r in runs), runs=runs))
    res = dict(task="MQAR", config={**asdict(cfg), "T": cfg.T}, device=str(device), torch=torch.__version__,
               threads=torch.get_num_threads(), jobs=jobs, seconds=time.perf_counter() - t0, results=rows)
    os.makedirs(out_dir, exist_ok=True)
    with atomic_path(os.path.join(out_dir, "results.json"), "the results") as tmp, open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    from .plot import plot_demo
    with atomic_path(os.path.join(out_dir, "mqar.png"), "the plot") as tmp:
        plot_demo(res, tmp)
    return res


def format_table(res):
    cfg = res["config"]
    pre = cfg.get("prefix", 0)
    lines = [f"MQAR: {cfg['num_kv']} key-value pairs, T = {cfg['T']}"
             + (f" ({pre} random tokens first)" if pre else "")
             + (", random filler" if cfg.get("noise") else "") + f", vocab {cfg['vocab_size']}, "
             f"d_model {cfg['d_model']}, {cfg['n_heads']} heads, {cfg['n_layers']} layers, {cfg['steps']} steps, "
             f"seeds {list(cfg['seeds'])} ({res['device']}, {res['seconds']:.0f} s)",
             f"{'mixer':<16}{'accuracy %':>11}{'state (numbers/seq)':>21}{'params':>9}{'seconds':>9}"]
    for r in res["results"]:
        acc = f"{100 * r['accuracy']:.1f}"
        if r["accuracy_max"] > r["accuracy_min"]:
            acc += f" ±{50 * (r['accuracy_max'] - r['accuracy_min']):.1f}"
        st = f"{r['state_numbers']}" + (" (KV, ∝T)" if r["state_grows_with_T"] else "")
        lines.append(f"{r['label']:<16}{acc:>11}{st:>21}{r['params']:>9}{r['seconds']:>9.1f}")
    return "\n".join(lines)
