"""Pieces shared by the token mixers: the mixer interface, norms, soft-capping, head reshapes."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def softcap(x, cap):
    """cap · tanh(x / cap) (paper 003, Eq. 107); identity when cap is None."""
    return x if cap is None else cap * torch.tanh(x / cap)


class RMSNorm(nn.Module):
    """x / rms(x) · w over the last dim, computed in float32."""

    def __init__(self, dim, eps=1e-6, affine=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.float()
        return y.to(x.dtype)


def head_norm(kind, dim, eps):
    """The per-head output norm: one norm over the head dim, its weights shared by the heads."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


def split_heads(x, H):
    """[..., H * D] -> [..., H, D]."""
    return x.view(*x.shape[:-1], H, x.shape[-1] // H)


def merge_heads(x):
    """[..., H, D] -> [..., H * D]."""
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def check_divisible(name, a, b):
    if a % b:
        raise ValueError(f"{name} = {a} must be divisible by the number of heads {b}")


class Mixer(nn.Module):
    """A token mixer. Subclasses define

        forward(x [B, T, d], state=None, cu_seqlens=None) -> (y [B, T, d], new_state)
        step(x_t [B, d], state) -> (y_t [B, d], new_state)

    `forward` runs the chunk path over a whole sequence, starting from `state` (None = zeros) and
    returning the state after its last token; with `cu_seqlens` (B == 1, N packed sequences) states
    hold N rows. `step` decodes one token from the state `forward` (or `step`) returned; state None
    starts from zeros. The state of a linear mixer has a size independent of the sequence length."""

    backend = "auto"
    chunk_size = 64
    context_parallel = False  # True where the layer's op takes a cp_group (see set_cp_group)
    cp_group = None

    def _kw(self, cu_seqlens):
        kw = dict(output_final_state=True, cu_seqlens=cu_seqlens, chunk_size=self.chunk_size, backend=self.backend)
        if self.cp_group is not None:
            kw["cp_group"] = self.cp_group
        return kw


def set_cp_group(module, group):
    """Context parallelism for every token mixer in `module` (a model or a mixer): `forward` then takes this
    rank's contiguous slice of T, the ranks of the torch.distributed `group` holding the slices in rank order
    (ula/core/context_parallel.py); None turns it off. `step` (decoding) is unaffected. Raises ValueError,
    naming the mixers, where one cannot (before changing any)."""
    mixers = [m for m in module.modules() if isinstance(m, Mixer)]
    bad = sorted({type(m).__name__ for m in mixers if not m.context_parallel})
    if group is not None and bad:
        raise ValueError(f"{', '.join(bad)} cannot run with context parallelism (a cp_group): its op takes none")
    for m in mixers:
        m.cp_group = group


def swish(x):
    return F.silu(x)
