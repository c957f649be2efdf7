"""Where the chunks of a call are, as tensors on its device: one layout for the Triton kernels (which chunk belongs to
which sequence, where it starts) and for the decay gradient (where each chunk ends, whether its sequence goes on).
Chunks start at each sequence's first step. Plain PyTorch (no Triton), so the PyTorch path shares it."""
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .cu_cache import cached, host_values


@dataclass
class Layout:
    """Without cu_seqlens every batch element has n = cdiv(T, C) chunks; with it, n counts the chunks of all
    sequences, one after another."""
    C: int
    n: int
    N: int
    varlen: bool
    cu: torch.Tensor           # int32 [N + 1] (a dummy without varlen)
    chunk_seq: torch.Tensor    # int32 [n]: sequence of each chunk
    chunk_start: torch.Tensor  # int32 [n]: first step of each chunk
    chunk_offset: torch.Tensor  # int32 [N + 1]: first chunk of each sequence


class Bounds(NamedTuple):
    """The decay gradient's view (ula/core/decay_grad.py): a batch row's chunks, or the packed sequences' chunks."""
    starts: torch.Tensor  # int32 [n]: first step of every chunk
    ends: torch.Tensor    # int32 [n]: exclusive end
    inner: torch.Tensor   # bool [n]: a chunk of the same sequence follows
    C: int                # chunk size


_DUMMY = {}  # per device: an int32 tensor passed where a kernel reads nothing (no allocation per call)


def make_layout(B, T, C, cu_seqlens, device):
    """The kernels' layout. With cu_seqlens it is built once per tensor (values read on the host once: the grid size
    n; ula/core/cu_cache.py)."""
    if cu_seqlens is None:
        z = _DUMMY.get(device)
        if z is None:
            z = _DUMMY[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return Layout(C, -(-T // C), B, False, z, z, z, z)
    return cached(cu_seqlens, ("layout", C, device), lambda: _packed_layout(cu_seqlens, C, device))


def _packed_layout(cu_seqlens, C, device):
    bounds = host_values(cu_seqlens)
    n = sum(-(-(e - s) // C) for s, e in zip(bounds, bounds[1:]))
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    N = cu.numel() - 1
    nch = (cu[1:] - cu[:-1] + C - 1) // C
    offset = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), nch.cumsum(0)])
    seq = torch.repeat_interleave(torch.arange(N, device=device), nch, output_size=n)
    local = torch.arange(n, device=device) - offset[seq]
    start = cu[seq] + local * C
    i32 = lambda x: x.to(torch.int32).contiguous()  # noqa: E731
    return Layout(C, n, N, True, i32(cu), i32(seq), i32(start), i32(offset))


def chunk_bounds(T, C, cu_seqlens, device):
    """The decay gradient's Bounds. Without cu_seqlens made on the device (no host-device copy, which would wait for
    the GPU's queue); with it, from the kernels' layout, once per cu_seqlens tensor."""
    if cu_seqlens is None:
        starts = torch.arange(0, T, C, device=device, dtype=torch.int32)
        return Bounds(starts, (starts + C).clamp_max(T), starts + C < T, C)
    return cached(cu_seqlens, ("bounds", C, device), lambda: _packed_bounds(make_layout(1, T, C, cu_seqlens, device)))


def _packed_bounds(layout):
    starts, C = layout.chunk_start, layout.C
    seq_end = layout.cu[1:][layout.chunk_seq.long()]
    return Bounds(starts, torch.minimum(starts + C, seq_end), starts + C < seq_end, C)
