"""`ula train`: a byte-level causal LM (`ula.models.CausalLM`, vocab 256) on a text corpus.

AdamW (weight decay on matrices only), warm-up + cosine or WSD schedule, gradient clipping, bfloat16
autocast on CUDA, validation loss in bits per byte, checkpoints that resume exactly, DDP under
torchrun (the same command; each rank draws its own batches), torch.compile of the training steps (--compile)."""
import json
import math
import os
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..models import CausalLM, LMConfig
from . import checkpoint as ckpt
from .context_parallel import ContextParallel
from .data import load_corpus, split, train_batch, val_batches
from .errors import ConfigError
from .files import atomic_path, check_out_dir
from .schedule import lr_factor

MODEL_DEFAULTS = dict(mixer="gla", d_model=128, n_layers=2, n_heads=4)
TRAIN_DEFAULTS = dict(steps=300, batch_size=16, seq_len=128, lr=2e-3, min_lr_ratio=0.1, warmup=30,
                      schedule="cosine", weight_decay=0.1, clip=1.0, eval_every=100, eval_batches=8,
                      save_every=100, val_frac=0.05, seed=0, minutes=None, data=None, context_parallel=1,
                      compile=None)
MODEL_KEYS, TRAIN_KEYS = tuple(MODEL_DEFAULTS), tuple(TRAIN_DEFAULTS)


class Dist:
    """rank / world size under torchrun (RANK, WORLD_SIZE, LOCAL_RANK), one process otherwise."""

    def __init__(self, device_arg):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = pick_device(device_arg, self.local, quiet=self.rank != 0)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world > 1:
            import torch.distributed as dist
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    @property
    def main(self):
        return self.rank == 0

    def mean(self, x):
        if self.world == 1:
            return x
        import torch.distributed as dist
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world

    def any(self, flag):
        """Whether `flag` is true on any rank (every rank gets the same answer: a decision that must be taken
        alike, such as stopping at a time limit, where each rank's own clock could disagree)."""
        if self.world == 1:
            return bool(flag)
        import torch.distributed as dist
        t = torch.tensor([int(bool(flag))], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self):
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()

    def close(self):
        if self.world > 1:
            import torch.distributed as dist
            dist.destroy_process_group()


def pick_device(arg, local_rank=0, quiet=False):
    """auto: CUDA when there is a GPU, else CPU. cuda without a GPU: CPU, with a note (the fallback)."""
    if arg in (None, "auto"):
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if arg.startswith("cuda") and not torch.cuda.is_available():
        if not quiet:
            print(f"note: --device {arg} asked for a GPU, but torch sees no CUDA GPU "
                  f"(torch {torch.__version__}); falling back to the CPU")
        return torch.device("cpu")
    if arg == "cuda":
        return torch.device(f"cuda:{local_rank}")
    return torch.device(arg)


def resolve(given, saved=None):
    """DEFAULTS <- saved (a resumed run's arguments) <- what was given (not None)."""
    out = {**MODEL_DEFAULTS, **TRAIN_DEFAULTS}
    out.update(saved or {})
    out.update({k: v for k, v in given.items() if v is not None and k in out})
    return out


def compiled(net, backend, cp):
    """net under torch.compile with `backend` (--compile): every mixer traces whole (RESULTS.md, session 34)."""
    if not backend:
        return net
    if cp.n > 1:
        raise ConfigError("--compile does not combine with --context-parallel (its collectives run between the "
                          "core's calls); drop one of them")
    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        hint = (f" ({backend!r} is a path: the data argument went to --compile; put it first, or write "
                f"--compile=inductor)" if os.path.exists(backend) else "")
        raise ConfigError(f"--compile: unknown torch.compile backend {backend!r}; one of "
                          f"{', '.join(sorted(known))}{hint}")
    return torch.compile(net, backend=backend)


def param_groups(model, wd):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [dict(params=decay, weight_decay=wd), dict(params=rest, weight_decay=0.0)]


@torch.no_grad()
def evaluate(model, val, a, device, amp, cp=None):
    """Mean validation loss per byte (with context parallelism cp: this slice's share of it)."""
    model.eval()
    tot = n = 0.0
    for x, y in val_batches(val, a["batch_size"], a["seq_len"], a["eval_batches"]):
        n += y.numel()
        x, y = cp.shard(x, y) if cp is not None else (x, y)
        x, y = x.to(device), y.to(device)
        with amp:
            logits, _ = model(x)
        tot += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum").item()
    model.train()
    return tot / n


def train(given, out_dir=None, resume=None, device="auto", quiet=False):
    """Runs training; returns the metrics dict (also written to <out>/metrics.json)."""
    d = Dist(device)
    dev = d.device
    saved, ck = None, None
    if resume:
        ck = ckpt.find(resume)
        trainer = ckpt.load_trainer(ck)
        saved = trainer["args"]
    a = resolve(given, saved)
    cfg = LMConfig(vocab_size=256, d_model=a["d_model"], n_layers=a["n_layers"], n_heads=a["n_heads"],
                   mixer=a["mixer"])
    out_flag = "--out"
    if ck:
        model, _ = ckpt.load_model(ck, "cpu")
        ckpt.check_shape(model.config, cfg, ck)
        if out_dir is None:
            out_dir = os.path.dirname(os.path.dirname(os.path.abspath(ck)))
            out_flag = "the run folder of --resume (else give --out)"
    else:
        torch.manual_seed(a["seed"])
        try:
            model = CausalLM(cfg)
        except ValueError as e:
            raise ConfigError(f"--mixer {cfg.mixer} with --d-model {cfg.d_model} and --heads {cfg.n_heads} makes no "
                              f"model: {e}") from e
    if out_dir is None:
        raise ConfigError("a new run needs an output folder (out_dir, --out)")
    check_out_dir(out_dir, out_flag)
    model = model.to(dev)
    cp = ContextParallel(a["context_parallel"], d.world, d.rank, cfg.mixer, a["seq_len"])
    cp.attach(model)
    data, name = load_corpus(a["data"])
    tr, val = split(data, a["val_frac"], a["seq_len"], name)
    opt = torch.optim.AdamW(param_groups(model, a["weight_decay"]), lr=a["lr"], betas=(0.9, 0.95),
                            fused=dev.type == "cuda")
    start, history = 0, dict(train=[], val=[])
    if ck:
        opt.load_state_dict(trainer["optimizer"])
        start, history = trainer["step"], trainer["history"]
        ckpt.restore_rng(trainer["rng"])
    net = compiled(cp.wrap(model, dev), a["compile"], cp)  # validation and checkpoints use the model itself
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else nullcontext()
    # out_dir is made by the first checkpoint save, so a run whose model fails before then leaves no empty folder
    compiled_how = f", compiled ({a['compile']})" if a["compile"] else ""
    if d.main and not quiet:
        print(f"ula train: {cfg.mixer}, d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, "
              f"{model.num_parameters() / 1e6:.2f}M parameters on {dev}"
              f"{f' x {d.world} ranks' if d.world > 1 else ''}"
              f"{f' ({cp.n} per sequence: context parallel)' if cp.n > 1 else ''}"
              f"{compiled_how}; corpus {name}: "
              f"{len(tr)} train / "
              f"{len(val)} validation bytes; steps {start}..{a['steps']}; out {out_dir}")

    def save(step):
        if d.main:
            ckpt.save(os.path.join(out_dir, "checkpoints", f"step-{step:06d}"), model, opt, step, a, history)
        d.barrier()

    def validate(step):
        v = d.mean(evaluate(model, val, a, dev, amp, cp)) * cp.n  # the slices' shares summed
        history["val"].append([step, v, v / math.log(2)])
        return v / math.log(2)

    tokens_per_step = a["batch_size"] * a["seq_len"] * cp.dp_size
    t0 = time.perf_counter()
    bar = tqdm(total=a["steps"], initial=start, disable=quiet or not d.main, dynamic_ncols=True,
               mininterval=0.5, unit="step")
    step, bpb, seen = start, None, 0
    while step < a["steps"]:
        # the ranks stop after the same step (their clocks start apart; a rank that stopped alone would validate
        # while another trained: mismatched collectives)
        if a["minutes"] is not None and d.any(time.perf_counter() - t0 > 60 * a["minutes"]):
            if d.main and not quiet:
                print(f"time budget of {a['minutes']} minutes reached at step {step}")
            break
        lr = a["lr"] * lr_factor(step, a["steps"], a["schedule"], a["warmup"], a["min_lr_ratio"])
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = cp.shard(*train_batch(tr, a["batch_size"], a["seq_len"], a["seed"], cp.dp_rank, step))
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with amp:
            logits, _ = net(x)
        loss = cp.loss(logits, y, a["batch_size"] * a["seq_len"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        cp.reduce_grads(model)
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a["clip"]) if a["clip"] else None
        opt.step()
        step += 1
        seen += tokens_per_step
        lv = d.mean(loss.item()) * cp.n
        history["train"].append([step, lv, lr])
        el = time.perf_counter() - t0
        post = dict(loss=f"{lv:.3f}", tok_s=f"{seen / max(el, 1e-9):,.0f}", lr=f"{lr:.1e}")
        if gn is not None:
            post["gnorm"] = f"{float(gn):.2f}"
        if bpb is not None:
            post["val_bpb"] = f"{bpb:.3f}"
        bar.set_postfix(post, refresh=False)
        bar.update(1)
        if step % a["eval_every"] == 0 or step == a["steps"]:
            bpb = validate(step)
            if d.main and not quiet:
                bar.write(f"step {step}: validation loss {bpb * math.log(2):.4f} nats/byte = {bpb:.4f} bits/byte")
        if step % a["save_every"] == 0 and step != a["steps"]:
            save(step)
    bar.close()
    if not history["val"] or history["val"][-1][0] != step:
        bpb = validate(step)
    save(step)
    el = time.perf_counter() - t0
    metrics = dict(args=a, model=cfg.to_dict(), parameters=model.num_parameters(), device=str(dev), world_size=d.world,
                   corpus=name, train_bytes=len(tr), val_bytes=len(val), steps_done=step, resumed_from=ck,
                   seconds=el, tokens_per_second=seen / max(el, 1e-9) if seen else None,
                   final_val_loss=history["val"][-1][1],
                   final_val_bpb=history["val"][-1][2], history=history)
    if d.main:
        with atomic_path(os.path.join(out_dir, "metrics.json"), "the metrics") as tmp, open(tmp, "w") as f:
            json.dump(metrics, f, indent=1)
        from .plots import plot_loss
        with atomic_path(os.path.join(out_dir, "loss.png"), "the loss curve") as tmp:
            plot_loss(history, tmp, title=f"{cfg.mixer}, d={cfg.d_model}, {name}")
        if not quiet:
            speed = (f"{step - start} steps in {el:.0f} s ({metrics['tokens_per_second']:,.0f} tokens/s)" if seen
                     else f"no step to train: the run was already at step {start} (raise --steps to go on)")
            print(f"done at step {step}: {speed}; validation {metrics['final_val_bpb']:.4f} bits/byte; "
                  f"wrote {out_dir}/metrics.json, loss.png, checkpoints/")
    d.close()
    return metrics
