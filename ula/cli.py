"""The `ula` command: `ula demo`, `ula train`, `ula generate`, `ula bench`, `ula info` (`python -m ula ...` too).

Outputs go to runs/<subcommand>-<timestamp>/ unless --out DIR is given."""
import argparse
import math
import os
import re
import sys
import time


class CLIError(Exception):
    pass


# ---- argument checks: a bad value stops the command before any work, in one line naming the flag ----
def _rule(conv, ok, need):
    """An argparse type: conv(text), kept when ok(value), else the error `argument --x: got 'text', needs
    <need>` (need: a text, or a function giving it)."""
    def check(text):
        try:
            v = conv(text)
        except (TypeError, ValueError):
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"got {text!r}, needs {need() if callable(need) else need}")
        return v
    return check


def _mixers():
    from .layers import MIXERS
    return sorted(MIXERS)


def _kinds():
    from .bench.runner import KINDS
    return KINDS


def _items(text):
    """The items of a comma-separated list, stripped, empty ones dropped ("a, b," -> ["a", "b"])."""
    return [t.strip() for t in text.split(",") if t.strip()]


def _listed(text, allowed=None):
    """text itself if it is a comma-separated list of one or more names of allowed() (or, with no allowed,
    of integers >= 1); else None. Commands read the items with _items."""
    items = _items(text)
    good = all(t in allowed() for t in items) if allowed else all(int(t) >= 1 for t in items)
    return text if items and good else None


_INT1, _INT0 = _rule(int, lambda v: v >= 1, "an integer >= 1"), _rule(int, lambda v: v >= 0, "an integer >= 0")
_RULES = dict.fromkeys(("steps", "batch_size", "seq_len", "d_model", "n_heads", "n_layers", "num_kv", "vocab_size",
                        "seeds", "threads", "jobs", "eval_every", "eval_batches", "save_every", "batch", "heads",
                        "head_dim", "reps", "context_parallel"), _INT1)
_RULES.update(
    warmup=_INT0, max_new_tokens=_INT0, prefix=_INT0,
    top_k=_rule(int, lambda v: v >= 0, "an integer >= 0 (0: no top-k cut)"),
    seed=_rule(int, lambda v: 0 <= v < 2**32, "an integer from 0 to 2**32 - 1"),
    lr=_rule(float, lambda v: math.isfinite(v) and v > 0, "a number > 0"),
    minutes=_rule(float, lambda v: math.isfinite(v) and v > 0, "a number of minutes > 0"),
    weight_decay=_rule(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0"),
    clip=_rule(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0 (0: no clipping)"),
    temperature=_rule(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0 (0: greedy)"),
    min_lr_ratio=_rule(float, lambda v: 0 <= v <= 1, "a number from 0 to 1"),
    val_frac=_rule(float, lambda v: 0 < v < 1, "a number between 0 and 1 (both excluded)"),
    top_p=_rule(float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    mixer=_rule(str, lambda v: v in _mixers(), lambda: f"one of {', '.join(_mixers())}"),
    mixers=_rule(lambda t: _listed(t, _mixers), bool, lambda: f"comma-separated names from {', '.join(_mixers())}"),
    kinds=_rule(lambda t: _listed(t, _kinds), bool, lambda: f"comma-separated names from {', '.join(_kinds())}"),
    seq_lens=_rule(_listed, bool, "comma-separated integers >= 1"),
    device=_rule(str, lambda v: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v), "auto, cpu, cuda or cuda:N"),
)


class _Parser(argparse.ArgumentParser):
    """Errors in one line (no usage block); an option whose dest is in _RULES gets that check as its type."""

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if action.option_strings and action.dest in _RULES:
            action.type = _RULES[action.dest]
        return action

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _out(args, sub):
    return args.out or os.path.join("runs", f"{sub}-{time.strftime('%Y%m%d-%H%M%S')}")


def _cpu_threads(n):
    """Threads for CPU work: n if given; else all cores when the machine is idle, one when others
    already keep it busy (OpenMP threads that wait on each other are very slow on a shared machine)."""
    import torch
    if n is None:
        cores = os.cpu_count() or 1
        try:
            busy = os.getloadavg()[0] > 0.5
        except OSError:
            busy = False
        n = 1 if busy else cores
    torch.set_num_threads(max(1, n))
    return torch.get_num_threads()


# ---- demo ------------------------------------------------------------------------------------------
def cmd_demo(args):
    import torch
    from .demo import TINY, DemoConfig, format_table, run_demo
    from .layers import MIXERS
    from .train.loop import pick_device
    dev = pick_device(args.device)
    if dev.type == "cpu":
        _cpu_threads(args.threads)
        jobs = args.jobs if args.jobs is not None else (1 if args.tiny else max(1, os.cpu_count() or 1))
    else:
        jobs = args.jobs if args.jobs is not None else (1 if args.tiny else 8)
    kw = dict(TINY) if args.tiny else {}
    for k in ("num_kv", "seq_len", "d_model", "n_heads", "steps", "batch_size", "lr", "vocab_size", "prefix"):
        if getattr(args, k) is not None:
            kw[k] = getattr(args, k)
    if args.seeds is not None:
        kw["seeds"] = tuple(range(args.seeds))
    if args.mixers:
        kw["mixers"] = tuple(_items(args.mixers))
        bad = [m for m in kw["mixers"] if m not in MIXERS]
        if bad:
            raise CLIError(f"unknown mixer(s) {bad}; choose from {sorted(MIXERS)}")
    if args.no_shift:
        kw["shift"] = False
    if args.noise:
        kw["noise"] = True
    cfg = DemoConfig(**kw)
    if cfg.num_kv < 1 or 2 * (cfg.num_kv + 1) > cfg.vocab_size:
        raise CLIError(f"--num-kv {cfg.num_kv} needs 1 <= num_kv and a vocabulary of at least "
                       f"{2 * (cfg.num_kv + 1)} (--vocab-size, now {cfg.vocab_size})")
    if cfg.prefix % 2:
        raise CLIError(f"--prefix {cfg.prefix} must be even (the sequence after it is laid out in pairs of positions)")
    if cfg.T - cfg.prefix < 4 * cfg.num_kv or cfg.T % 2:
        raise CLIError(f"--seq-len {cfg.T} must be even and at least --prefix + 4 * num_kv = "
                       f"{cfg.prefix + 4 * cfg.num_kv}")
    if cfg.d_model % cfg.n_heads:
        raise CLIError(f"--d-model {cfg.d_model} must be divisible by --heads {cfg.n_heads}")
    out = _out(args, "demo")
    how = (f"{jobs} worker processes" + (" of 1 thread" if dev.type == "cpu" else "") if jobs > 1
           else f"{torch.get_num_threads()} thread{'s' * (torch.get_num_threads() > 1)}" if dev.type == "cpu"
           else "1 process")
    print(f"ula demo: MQAR with {len(cfg.mixers)} mixers on {dev} ({how}); writing {out}")
    res = run_demo(cfg, out, dev, jobs=jobs)
    print(format_table(res))
    print(f"wrote {os.path.join(out, 'results.json')} and {os.path.join(out, 'mqar.png')}")
    return 0


# ---- train / generate ----------------------------------------------------------------------------
def cmd_train(args):
    from .train import train
    from .train.loop import MODEL_KEYS, TRAIN_KEYS, pick_device
    if pick_device(args.device, quiet=True).type == "cpu" and "WORLD_SIZE" not in os.environ:
        _cpu_threads(args.threads)
    given = {k: getattr(args, k, None) for k in MODEL_KEYS + TRAIN_KEYS}
    out = args.out if (args.out or args.resume) else _out(args, "train")
    train(given, out_dir=out, resume=args.resume, device=args.device)
    return 0


def cmd_generate(args):
    import torch
    from .train.checkpoint import load_model
    from .train.loop import pick_device
    dev = pick_device(args.device)
    model, ck = load_model(args.checkpoint, dev)
    model.eval()
    if model.config.vocab_size != 256:
        raise CLIError(f"{ck} holds a model with vocab_size {model.config.vocab_size}, not a byte-level one (256)")
    g = torch.Generator(device=dev).manual_seed(args.seed)
    prompt = args.prompt.encode("utf-8", "surrogateescape") or b"\n"   # bytes of the shell's argument as given
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
    out = model.generate(ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k or None,
                         top_p=args.top_p, greedy=args.greedy, generator=g)
    text = bytes(out[0].tolist()).decode("utf-8", errors="replace")
    print(text)
    return 0


# ---- bench ---------------------------------------------------------------------------------------
def cmd_bench(args):
    from .bench.runner import run_bench
    from .train.loop import pick_device
    if pick_device(args.device, quiet=True).type == "cpu":
        _cpu_threads(args.threads)
    out = _out(args, "bench")
    lens = [int(t) for t in _items(args.seq_lens)] if args.seq_lens else None
    run_bench(out, kinds=_items(args.kinds), seq_lens=lens, batch=args.batch, heads=args.heads,
              head_dim=args.head_dim, peers=not args.no_peers, device=args.device, reps=args.reps, graph=args.graph)
    return 0


# ---- info ----------------------------------------------------------------------------------------
def cmd_info(args):
    from .info import main as info
    return info(args.json)


def build_parser():
    p = _Parser(prog="ula", description="Unified Linear Attention: recall demo, language-model training, "
                "kernel benchmarks.")
    sub = p.add_subparsers(dest="command", metavar="{demo,train,generate,bench,info}")

    d = sub.add_parser("demo", help="MQAR recall: linear mixers vs softmax attention at equal width",
                       description="Multi-query associative recall (MQAR) generated on the fly; trains a small "
                       "2-layer model per mixer, prints accuracy and state size, writes results.json and mqar.png.")
    d.add_argument("--tiny", action="store_true", help="a few seconds' version (for tests)")
    d.add_argument("--mixers", help="comma-separated mixers of ula.layers.MIXERS (default: linear,retnet,gla,"
                   "mlstm_sig,mlstm_exp,gsa,normalized,softmax; mamba2 and hgrn2 only when named)")
    d.add_argument("--num-kv", type=int, help="key-value pairs per sequence (default 8)")
    d.add_argument("--seq-len", type=int, help="sequence length (default prefix + 4 * num_kv; longer pads with "
                   "filler)")
    d.add_argument("--vocab-size", type=int, help="vocabulary: keys from the lower, values from the upper half "
                   "(default 20)")
    d.add_argument("--prefix", type=int, help="random tokens before the key-value pairs, a past holding stale "
                   "bindings of the keys that a decaying state can forget (default 32; 0: plain MQAR as in "
                   "Zoology)")
    d.add_argument("--noise", action="store_true", help="random tokens instead of the filler 0 between the "
                   "queries (Zoology's random_non_queries; never this sequence's keys)")
    d.add_argument("--d-model", type=int, help="model width (default 64)")
    d.add_argument("--heads", dest="n_heads", type=int, help="heads (default 2)")
    d.add_argument("--steps", type=int, help="training steps per model")
    d.add_argument("--batch-size", type=int)
    d.add_argument("--lr", type=float)
    d.add_argument("--seeds", type=int, help="number of seeds per mixer (mean and range are reported)")
    d.add_argument("--no-shift", action="store_true", help="no token shift at the input (harder: recall then "
                   "needs an induction circuit built from the mixers alone)")
    d.add_argument("--device", default="auto", help="auto (GPU if any), cpu, cuda")
    d.add_argument("--threads", type=int, help="CPU threads (default: all cores if idle, else 1)")
    d.add_argument("--jobs", type=int, help="models trained side by side, one process each (CPU: one thread "
                   "each; default: the number of cores on a CPU, 8 on a GPU, 1 with --tiny)")
    d.add_argument("--out", help="output folder (default runs/demo-<timestamp>)")
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("train", help="train a byte-level causal LM on a text file or folder",
                       description="Byte-level causal LM. With no DATA: the English documentation of Python's "
                       "standard library (pydoc_data.topics). Under torchrun: DDP, the same command.")
    t.add_argument("data", nargs="?", help="text file or folder (default: built-in pydoc_data.topics)")
    t.add_argument("--mixer", help="a mixer of ula.layers.MIXERS (default gla)")
    t.add_argument("--d-model", type=int, help="default 128")
    t.add_argument("--layers", dest="n_layers", type=int, help="default 2")
    t.add_argument("--heads", dest="n_heads", type=int, help="default 4")
    t.add_argument("--steps", type=int, help="total optimizer steps (default 300)")
    t.add_argument("--minutes", type=float, help="stop after this many minutes (checkpoint saved)")
    t.add_argument("--batch-size", type=int, help="sequences per step and rank (default 16)")
    t.add_argument("--seq-len", type=int, help="bytes per sequence (default 128)")
    t.add_argument("--lr", type=float, help="peak learning rate (default 2e-3)")
    t.add_argument("--min-lr-ratio", type=float, help="final lr / peak (default 0.1)")
    t.add_argument("--warmup", type=int, help="warm-up steps (default 30)")
    t.add_argument("--schedule", choices=["cosine", "wsd", "constant"], help="default cosine")
    t.add_argument("--weight-decay", type=float)
    t.add_argument("--clip", type=float, help="gradient-norm clip (default 1.0, 0 = none)")
    t.add_argument("--eval-every", type=int, help="validation every N steps (default 100)")
    t.add_argument("--eval-batches", type=int, help="validation batches (default 8)")
    t.add_argument("--save-every", type=int, help="checkpoint every N steps (default 100)")
    t.add_argument("--val-frac", type=float, help="fraction of the corpus held out (default 0.05)")
    t.add_argument("--seed", type=int)
    t.add_argument("--context-parallel", type=int, metavar="N", help="under torchrun: N ranks share each batch of "
                   "sequences, each holding a contiguous slice of --seq-len (world size a multiple of N; mixers "
                   "gla, mlstm_exp, mlstm_sig; default 1: none)")
    t.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                   help="torch.compile the training steps (backend inductor unless given, e.g. aot_eager); not with "
                   "--context-parallel")
    t.add_argument("--resume", help="run folder or checkpoint folder to continue from exactly")
    t.add_argument("--device", default="auto", help="auto (GPU if any), cpu, cuda")
    t.add_argument("--threads", type=int, help="CPU threads")
    t.add_argument("--out", help="output folder (default runs/train-<timestamp>; with --resume, its run)")
    t.set_defaults(func=cmd_train)

    g = sub.add_parser("generate", help="sample text from a `ula train` checkpoint")
    g.add_argument("checkpoint", help="run folder (latest checkpoint) or checkpoint folder")
    g.add_argument("--prompt", default="", help="text to continue")
    g.add_argument("--max-new-tokens", type=int, default=200, help="bytes to generate (default 200)")
    g.add_argument("--temperature", type=float, default=0.8, help="softmax temperature (default 0.8; 0: greedy)")
    g.add_argument("--top-k", type=int, help="sample among the k likeliest bytes only (default: all)")
    g.add_argument("--top-p", type=float, help="sample among the likeliest bytes whose probabilities reach p "
                   "(nucleus; default: all)")
    g.add_argument("--greedy", action="store_true", help="always the likeliest byte")
    g.add_argument("--seed", type=int, default=0, help="random seed of the sampling (default 0)")
    g.add_argument("--device", default="auto", help="auto (GPU if any), cpu, cuda")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="time ours against the installed peers over sequence lengths",
                       description="Forward and forward+backward time and peak memory of ula.linear_attention "
                       "(every decay kind) and of the peers installed (fla, mlstm-kernels, lightning-attn, SDPA "
                       "flash attention) over sequence lengths; table, results.json, PNG plots.")
    b.add_argument("--kinds", default="none,constant,scalar,vector",
                   help=f"comma-separated decay kinds from {', '.join(_kinds())} (default: the four decays)")
    b.add_argument("--seq-lens", default=None, help="comma-separated T (default GPU 1024..16384, CPU 256,512,1024)")
    b.add_argument("--batch", type=int, default=None, help="batch size B (default GPU 4, CPU 1)")
    b.add_argument("--heads", type=int, default=None, help="heads H (default GPU 16, CPU 2)")
    b.add_argument("--head-dim", type=int, default=None, help="K = V per head (default GPU 128, CPU 32)")
    b.add_argument("--reps", type=int, default=None, help="timed repetitions (CPU)")
    b.add_argument("--no-peers", action="store_true", help="time ours only")
    b.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="also time CUDA-graph replays: the GPU's time without the host's launches, which bound short "
                   "calls timed eagerly (default: on a GPU; a CPU has no graphs)")
    b.add_argument("--threads", type=int, help="CPU threads")
    b.add_argument("--device", default="auto")
    b.add_argument("--out", help="output folder (default runs/bench-<timestamp>)")
    b.set_defaults(func=cmd_bench)

    i = sub.add_parser("info", help="versions, GPUs and the path backend='auto' takes on each (for bug reports)",
                       description="Prints ula's, Python's, torch's and Triton's versions, every visible GPU with "
                       "the path backend='auto' runs on it and the warnings it gives, and the ULA_* settings.")
    i.add_argument("--json", action="store_true", help="the same as JSON")
    i.set_defaults(func=cmd_info)
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if not getattr(args, "command", None):
        p.print_help()
        return 2
    from .train.errors import UsageError
    try:
        return args.func(args)
    except (CLIError, UsageError) as e:
        print(f"ula {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
