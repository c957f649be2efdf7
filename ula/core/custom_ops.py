"""Forward and backward functions registered as a pair of torch.library custom ops, the backward wired as the
forward's autograd: opaque to torch.compile, which traces through their fake (meta) functions. The core (op.py),
the column of ones (ones.py), mLSTMexp's gate scan (ula/ops/_mlstm_gate_op.py) and normalized attention's fused
Function (ula/ops/_normalized_op.py) take them while compiling, so a trace runs the same kernels as an eager call.

A call whose kernels' sizes come from cu_seqlens' values (read on the host) must not be kept in a CUDA graph: a
replay would reuse one call's boundaries for every other. Such pairs are tagged cudagraph_unsafe, and torch.compile's
CUDA graphs (mode="reduce-overhead") split the graph around them and run them with the boundaries of each call.
Where a graph also consumes cu_seqlens, such an op gets the graph's copy of it: one tensor for every call, its
memory rewritten by each call without a version bump, so ula.core.cu_cache would return the first call's values
(session 35: packed mLSTMexp wrong from the first replay on, its gate scan in the graphs). While torch.compile's
CUDA graphs are in use (from the first call that sees them on), these ops read cu_seqlens afresh at every call."""
import functools
import sys

import torch

from . import cu_cache

_UNSAFE = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()
EMPTY = (0,)  # the shape of an absent output: custom ops cannot return None


def or_empty(x, like):
    """x, or an empty tensor like `like` where x is None."""
    return like.new_empty(EMPTY) if x is None else x


def fake_like(x, like, need=True):
    """A fake function's output shaped as x, or empty (like `like`) where x is None or not needed."""
    return x.new_empty(x.shape) if x is not None and need else like.new_empty(EMPTY)


_TREES_SEEN = False  # once seen, in any thread, kept: a backward op runs in autograd's thread, after its forward


def graph_trees_in_use():
    """Whether torch.compile's CUDA graphs (cudagraph trees) manage the current CUDA device, or have since this process
    first saw them; True where that cannot be told (an unknown torch): reading cu_seqlens again is only slower."""
    global _TREES_SEEN
    if _TREES_SEEN:
        return True
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None or not torch.cuda.is_available():
        return False
    try:
        _TREES_SEEN = trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False) is not None
    except Exception:
        _TREES_SEEN = True
    return _TREES_SEEN


def _fresh_under_graph_trees(fn):
    """fn, reading cu_seqlens afresh while torch.compile's CUDA graphs are in use (the module's docstring)."""
    @functools.wraps(fn)  # the signature stays fn's: it is the op's schema
    def run(*args):
        with cu_cache.fresh(graph_trees_in_use()):
            return fn(*args)
    return run


def define_pair(name, fwd, fwd_fake, bwd, bwd_fake, setup_context, grads, graph_safe=True):
    """(forward op, backward op) named ula::{name}_fwd and _bwd. fwd, bwd: annotated functions (their annotations
    are the ops' schemas); grads(ctx, *output gradients, backward op) -> the forward inputs' gradients."""
    tags = None if graph_safe else _UNSAFE
    if not graph_safe:
        fwd, bwd = _fresh_under_graph_trees(fwd), _fresh_under_graph_trees(bwd)
    f = torch.library.custom_op(f"ula::{name}_fwd", fwd, mutates_args=(), tags=tags)
    f.register_fake(fwd_fake)
    b = torch.library.custom_op(f"ula::{name}_bwd", bwd, mutates_args=(), tags=tags)
    b.register_fake(bwd_fake)
    f.register_autograd(lambda ctx, *g: grads(ctx, *g, b), setup_context=setup_context)
    return f, b


def dense_and_packed(name, *functions):
    """Two pairs of the same functions: ula::{name}_* for calls without cu_seqlens, ula::{name}_packed_* for calls
    with it (tagged cudagraph_unsafe)."""
    return define_pair(name, *functions), define_pair(f"{name}_packed", *functions, graph_safe=False)
