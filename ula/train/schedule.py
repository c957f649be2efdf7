"""Learning-rate schedules as a multiplier of the peak rate, by step.

cosine: linear warm-up, then cosine decay to min_ratio at `total` steps.
wsd:    warm-up, stable at the peak, then a linear decay to min_ratio over the last `decay_frac` of the
        steps (warmup-stable-decay)."""
import math

SCHEDULES = ("cosine", "wsd", "constant")


def lr_factor(step, total, kind="cosine", warmup=0, min_ratio=0.1, decay_frac=0.2):
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    start = total - max(1, int(decay_frac * total))
    if step < start:
        return 1.0
    p = min(1.0, (step - start) / max(1, total - start))
    return 1.0 - (1 - min_ratio) * p
