"""Checkpoints that resume exactly: `<run>/checkpoints/step-NNNNNN/` holds the model
(config.json + model.safetensors, loadable by `CausalLM.from_pretrained`) and trainer.pt (optimizer,
step, RNG states, training arguments, history). Written whole into a temporary folder beside it,
flushed to disk and renamed into place (`files.atomic_dir`): a failed save leaves every earlier
checkpoint as it was."""
import glob
import os
import re

import torch

from ..models import CausalLM, LMConfig
from .errors import UsageError
from .files import atomic_dir

TRAINER = "trainer.pt"
TRAINER_KEYS = ("step", "optimizer", "rng", "args", "history")


class CheckpointError(UsageError):
    """A checkpoint that is missing, unreadable (corrupt, truncated) or does not fit the model asked for."""


def save(directory, model, optimizer, step, args, history, scaler=None):
    with atomic_dir(directory, "the checkpoint") as tmp:
        model.save_pretrained(tmp)
        rng = dict(torch=torch.get_rng_state(),
                   cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
        torch.save(dict(step=step, optimizer=optimizer.state_dict(), rng=rng, args=args, history=history,
                        scaler=scaler.state_dict() if scaler is not None else None), os.path.join(tmp, TRAINER))


def find(path):
    """The checkpoint folder for path: a checkpoint itself, or a run folder (its latest checkpoint)."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint path {path!r} does not exist; it needs a run folder of `ula train` "
                              f"or one of its checkpoints/step-NNNNNN/ folders")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    # by step number, not name: step-1000000 has one digit more than step-999900
    steps = sorted((int(m[1]), f) for f in glob.glob(os.path.join(glob.escape(path), "checkpoints", "step-*[0-9]"))
                   if (m := re.fullmatch(r"step-(\d+)", os.path.basename(f))))
    if not steps:
        raise CheckpointError(f"no checkpoint in {path!r} (expected config.json there, or "
                              f"checkpoints/step-NNNNNN/ under a run folder)")
    return steps[-1][1]


def check_shape(saved: LMConfig, wanted: LMConfig, where):
    diff = {k: (getattr(saved, k), getattr(wanted, k)) for k in
            ("vocab_size", "d_model", "n_layers", "n_heads", "mixer", "mlp_ratio", "tie_embeddings", "mixer_kwargs")
            if getattr(saved, k) != getattr(wanted, k)}
    if diff:
        txt = ", ".join(f"{k}: checkpoint {a!r}, asked {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"the checkpoint in {where} is of another model shape ({txt}); drop the model "
                              f"options to take the checkpoint's, or start a new run")


def _unreadable(what, ck, e):
    msg = " ".join(str(e).split()) or type(e).__name__       # one line
    return CheckpointError(f"cannot load {what} in {ck!r} ({type(e).__name__}: {msg[:300]}); the files there are "
                           f"corrupt, truncated or not of `ula train` (an earlier checkpoint may still load)")


def load_model(path, device="cpu"):
    ck = find(path)
    try:
        return CausalLM.from_pretrained(ck, map_location=device), ck
    except Exception as e:            # whatever a damaged file makes the readers raise
        raise _unreadable("the model", ck, e) from e


def load_trainer(ck):
    f = os.path.join(ck, TRAINER)
    if not os.path.exists(f):
        raise CheckpointError(f"{ck!r} holds no {TRAINER} (the optimizer and data position), so training cannot "
                              f"resume from it; `ula generate` can still sample from it")
    try:
        trainer = torch.load(f, map_location="cpu", weights_only=False)
    except Exception as e:
        raise _unreadable("the training state", ck, e) from e
    if not isinstance(trainer, dict) or any(k not in trainer for k in TRAINER_KEYS):
        raise CheckpointError(f"{f!r} is not a `ula train` training state (it needs the keys {list(TRAINER_KEYS)})")
    return trainer


def restore_rng(rng):
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
