"""Checkpoints that resume exactly: `<run>/checkpoints/step-NNNNNN/` holds the model
(config.json + model.safetensors, loadable by `CausalLM.from_pretrained`) and trainer.pt (optimizer,
step, RNG states, training arguments, history). Written to a temporary folder, then renamed."""
import glob
import os
import shutil

import torch

from ..models import CausalLM, LMConfig

TRAINER = "trainer.pt"


class CheckpointError(ValueError):
    """A checkpoint that is missing or does not fit the model asked for."""


def save(directory, model, optimizer, step, args, history, scaler=None):
    tmp = directory + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    rng = dict(torch=torch.get_rng_state(), cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    torch.save(dict(step=step, optimizer=optimizer.state_dict(), rng=rng, args=args, history=history,
                    scaler=scaler.state_dict() if scaler is not None else None), os.path.join(tmp, TRAINER))
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def find(path):
    """The checkpoint folder for path: a checkpoint itself, or a run folder (its latest checkpoint)."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    steps = sorted(glob.glob(os.path.join(path, "checkpoints", "step-*[0-9]")))
    if not steps:
        raise CheckpointError(f"no checkpoint in {path!r} (expected config.json there, or "
                              f"checkpoints/step-NNNNNN/ under a run folder)")
    return steps[-1]


def check_shape(saved: LMConfig, wanted: LMConfig, where):
    diff = {k: (getattr(saved, k), getattr(wanted, k)) for k in
            ("vocab_size", "d_model", "n_layers", "n_heads", "mixer", "mlp_ratio", "tie_embeddings", "mixer_kwargs")
            if getattr(saved, k) != getattr(wanted, k)}
    if diff:
        txt = ", ".join(f"{k}: checkpoint {a!r}, asked {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"the checkpoint in {where} is of another model shape ({txt}); drop the model "
                              f"options to take the checkpoint's, or start a new run")


def load_model(path, device="cpu"):
    ck = find(path)
    try:
        return CausalLM.from_pretrained(ck, map_location=device), ck
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(f"cannot load the model in {ck}: {e}") from e


def load_trainer(ck):
    return torch.load(os.path.join(ck, TRAINER), map_location="cpu", weights_only=False)


def restore_rng(rng):
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
