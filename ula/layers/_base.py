"""Pieces shared by the token mixers: the mixer interface, norms, soft-capping, head reshapes."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..core.checks import check_chunk_backend
from ..ops._common import decay_dtype, states_updated_in_place


def wide(x):
    """x in float32, or float64 for a float64 model: gates and norms keep a float64 model float64 throughout."""
    return x.to(decay_dtype(x))


def softcap(x, cap):
    """cap · tanh(x / cap) (paper 003, Eq. 107); identity when cap is None."""
    return x if cap is None else cap * torch.tanh(x / cap)


class RMSNorm(nn.Module):
    """x / rms(x) · w over the last dim, computed in float32 (float64 for float64 x)."""

    def __init__(self, dim, eps=1e-6, affine=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x):
        if self.weight is None or self.weight.dtype == x.dtype:
            # one fused kernel on CUDA (float32 math inside; equal dtypes only), where the expression below is
            # ~8: a decoding step runs three norms per layer, and small steps are bound by their kernel count
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        y = wide(x)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.to(y.dtype)
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


def check_divisible(name, a, b, how=None):
    """a width (name = a, derived as `how`, e.g. "int(d_model · expand_k)") split into b heads."""
    got = f"{name} = {a}" if how is None else f"{name} = {how} = {a}"
    if a < 1:
        raise ValueError(f"{got} must be at least 1")
    if a % b:
        raise ValueError(f"{got} must be divisible by the number of heads {b}")


def map_state(fn, state):
    """fn applied to every tensor of a state (a tensor or nested tuples / lists of them)."""
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, (tuple, list)):
        return type(state)(map_state(fn, s) for s in state)
    if state is None:
        return None
    raise TypeError(f"a mixer state is a tensor or a tuple / list of them, got {type(state).__name__}")


def state_tensors(state):
    if isinstance(state, torch.Tensor):
        return [state]
    return [t for s in (state or ()) for t in state_tensors(s)]


def copy_state_(dst, src):
    """Copies the tensors of state src into those of dst (same structure and shapes), in place."""
    d, s = state_tensors(dst), state_tensors(src)
    if len(d) != len(s):
        raise ValueError(f"states differ in structure: {len(d)} tensors to fill, {len(s)} given")
    for a, b in zip(d, s):
        if a.shape != b.shape:
            raise ValueError(f"state tensor of shape {tuple(b.shape)} does not fit a buffer of shape {tuple(a.shape)}")
        if a is not b:
            a.copy_(b)


class Mixer(nn.Module):
    """A token mixer. Subclasses define

        forward(x [B, T, d], state=None, cu_seqlens=None) -> (y [B, T, d], new_state)
        step(x_t [B, d], state) -> (y_t [B, d], new_state)

    `forward` runs the chunk path over a whole sequence, starting from `state` (None = zeros) and
    returning the state after its last token; with `cu_seqlens` (B == 1, N packed sequences) states
    hold N rows. `step` decodes one token from the state `forward` (or `step`) returned; state None
    starts from zeros. The state of a linear mixer has a size independent of the sequence length.
    `static_state` / `load_static_state` / `step_static` decode from preallocated buffers updated in place
    (what a CUDA graph replays, see ula.models.cuda_graph); by default `step` plus a copy, softmax
    attention overrides them with a KV cache of a maximum length."""

    backend = "auto"
    chunk_size = None  # the backend's measured choice

    def __init__(self, d_model, n_heads, chunk_size=None, backend="auto"):
        """The arguments every mixer takes, checked: widths positive ints; chunk_size, backend as the ops take them."""
        super().__init__()
        for name, x in (("d_model", d_model), ("n_heads", n_heads)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be a positive int, got {x!r}")
        check_chunk_backend(chunk_size, backend, type(self).__name__)
    context_parallel = False  # True where the layer's op takes a cp_group (see set_cp_group)
    cp_group = None

    uses_length = False  # True where step_static reads a max-length buffer up to a bound (softmax's KV cache)

    # ---- static states (preallocated, updated in place: what one CUDA graph can replay per token) ----------
    def static_state(self, state, max_len):
        """Preallocated buffers for `step_static`, holding a copy of `state` (as `forward` or `step` returned
        it). max_len: the most tokens the buffers must cover (a linear mixer's state ignores it)."""
        return map_state(lambda t: t.detach().clone(memory_format=torch.contiguous_format), state)

    def load_static_state(self, buffers, state):
        """Copies `state` into the buffers of `static_state` (in place)."""
        copy_state_(buffers, state)

    def step_static(self, x, buffers, pos, bound=None):
        """One token, x [B, d] -> y [B, d], from the buffers of `static_state`, updated in place to the state
        after this token. pos: int64 [1] on the device, the number of tokens before this one. bound: a number
        of positions >= pos + 1 that a length-dependent state (uses_length) reads; None: all of it.
        Neither synchronizes with the host nor allocates what outlives the call, so a CUDA graph can capture
        it. By default `step`, then its new state copied into the buffers (the same numbers as `step`)."""
        with states_updated_in_place():  # the fused CUDA step writes into the buffers: the copy is then a no-op
            y, new = self.step(x, buffers)
        copy_state_(buffers, new)
        return y

    def _kw(self, cu_seqlens):
        kw = dict(output_final_state=True, cu_seqlens=cu_seqlens, chunk_size=self.chunk_size, backend=self.backend)
        if self.cp_group is not None:
            kw["cp_group"] = self.cp_group
        return kw


def set_cp_group(module, group):
    """Context parallelism for every token mixer in `module` (a model or a mixer): `forward` then takes this
    rank's contiguous slice of T, the ranks of the torch.distributed `group` holding the slices in rank order
    (ula/core/context_parallel.py); None turns it off. `step` (decoding) is unaffected. Raises ValueError,
    naming the mixers, where one cannot, and TypeError for a group that is no ProcessGroup (before changing any)."""
    mixers = [m for m in module.modules() if isinstance(m, Mixer)]
    # a mixer whose op takes no cp_group, or another module that reads across time (the demo's token shift)
    bad = sorted({type(m).__name__ for m in module.modules() if getattr(m, "context_parallel", True) is False})
    if group is not None and bad:
        from . import CP_MIXERS
        raise ValueError(f"{', '.join(bad)} cannot run with context parallelism (a cp_group): it mixes tokens "
                         f"across the slices' boundaries without one; the mixers that can: {', '.join(CP_MIXERS)}")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"set_cp_group: group must be a torch.distributed ProcessGroup or None, got "
                        f"{type(group).__name__}")
    for m in mixers:
        m.cp_group = group


def swish(x):
    return F.silu(x)
