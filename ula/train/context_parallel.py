"""`ula train --context-parallel N`: one batch of sequences shared by N ranks, each holding a contiguous slice
of T (ula/core/context_parallel.py carries the mixers' states across the slices).

Under torchrun with world size W (a multiple of N), rank r is

    slice rank    c = r mod N    (its slice [s_c, e_c) of T; slices as equal as can be, the first ones longer)
    replica       g = r div N    (the data-parallel replica: the batch of step t is drawn for (seed, g, t))

The N ranks g·N .. g·N + N − 1 form the context-parallel (cp) group of replica g; the ranks with the same c
form the data-parallel (dp) group of slice c (W / N replicas). The model is wrapped in DDP over the dp group.

Loss and gradients. One process on the whole sequence minimises L = Σ_tokens CE / (B·T). Rank c of a cp group
computes L_c = Σ_{its slice's tokens} CE / (B·T), so L = Σ_c L_c; the context-parallel ops' backward sends
the gradient of every L_c to the earlier slices (their states feed it), so Σ_c ∇L_c (summed over the ranks
of the cp group) is ∇L, the whole sequence's gradient. DDP averages over the replicas (dp group); then
`reduce_grads` sums over the cp group, in the parameters' order (the same on every rank of the group: a
single coalesced all-reduce). Clipping and AdamW then see the same gradients as one process on the whole
sequence, on every rank, and the parameters stay identical.

No part of the LM depends on the position (no positional embedding; the only mixer with RoPE, softmax
attention, cannot run on slices and is refused), so the slices need no global positions. Mixers whose ops
take no cp_group raise a ConfigError naming the mixer."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..layers import CP_MIXERS
from ..layers._base import set_cp_group
from .errors import ConfigError


def cp_mixers():
    """The mixers of ula.layers.MIXERS that can run context-parallel (their ops take a cp_group)."""
    return CP_MIXERS


def slice_bounds(T, n):
    """Contiguous slices of range(T) for n ranks: [(s_0, e_0), ...], lengths differing by at most 1."""
    base, extra = divmod(T, n)
    out, s = [], 0
    for j in range(n):
        e = s + base + (j < extra)
        out.append((s, e))
        s = e
    return out


class ContextParallel:
    """The groups and the data split of --context-parallel n (1: none, the plain data-parallel run)."""

    def __init__(self, n, world, rank, mixer, seq_len):
        if n is None or n < 1:
            raise ConfigError(f"--context-parallel must be an integer >= 1, got {n}")
        if n > 1 and mixer not in cp_mixers():
            raise ConfigError(f"--mixer {mixer} cannot run with --context-parallel {n}: its op takes no cp_group "
                              f"(mixers that can: {', '.join(cp_mixers())})")
        if world % n:
            raise ConfigError(f"--context-parallel {n} needs a world size divisible by {n} (torchrun "
                              f"--nproc-per-node ...), got {world} process{'es' if world > 1 else ''}")
        if seq_len < n:
            raise ConfigError(f"--context-parallel {n} needs --seq-len >= {n} (a token per rank), got {seq_len}")
        self.n, self.world = n, world
        self.dp_size, self.dp_rank, self.cp_rank = world // n, rank // n, rank % n
        self.cp_group = self.dp_group = None
        self.bounds = slice_bounds(seq_len, n)
        if n > 1:  # every rank creates every group, in the same order
            for g in range(world // n):
                grp = dist.new_group(list(range(g * n, (g + 1) * n)))
                if g == self.dp_rank:
                    self.cp_group = grp
            for c in range(n):
                grp = dist.new_group(list(range(c, world, n)))
                if c == self.cp_rank:
                    self.dp_group = grp

    def attach(self, model):
        """Give the model's mixers the cp group (n > 1)."""
        if self.n > 1:
            set_cp_group(model, self.cp_group)
        return model

    def wrap(self, model, device):
        """DDP over the data-parallel group (the model itself when there is one replica and no cp)."""
        if self.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP
        ids = [device.index] if device.type == "cuda" else None
        if self.n == 1:
            return DDP(model, device_ids=ids)
        return DDP(model, device_ids=ids, process_group=self.dp_group)

    def shard(self, x, y):
        """This rank's slice of a batch [B, T] (the whole batch without cp)."""
        if self.n == 1:
            return x, y
        s, e = self.bounds[self.cp_rank]
        return x[:, s:e], y[:, s:e]

    def loss(self, logits, y, total):
        """Mean cross-entropy over the whole sequence batch (`total` tokens), this slice's share of it."""
        if self.n == 1:
            return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum") / total

    @torch.no_grad()
    def reduce_grads(self, model):
        """Sum the gradients over the cp group (after DDP's average over the replicas)."""
        if self.n == 1:
            return
        params = list(model.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.cp_group)
            for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))
