"""Parallel compilation of a call's kernels on its first call (issue 3: a new shape's first call within 20 s).
A forward+backward launches 10-25 distinct kernel configurations; Triton compiles each on first launch, one
after another (~1.5 s each for sm_90). Here the call is first run "dry": every launch becomes a compile request
(Triton's warmup, no kernel runs) handed to a thread pool through Triton's AsyncCompileMode, whose compiles run
mostly outside the GIL (MLIR/LLVM passes, ptxas). The real call then finds them compiled.

Best effort: the dry run's outputs are never read, a launch it misses (host code that reads a kernel's result)
is compiled serially by the real call as before, and any error inside it is dropped (the real call reports it).
Once per configuration key per process; skipped under the interpreter, while tracing, or when
ULA_PRECOMPILE=0. Users: the core op (ula/core/op.py), the column-of-ones op (ula/core/ones.py), mLSTMexp's gate
scan, normalized attention's fused Function and ABC's cumulative softmax (ula/ops)."""
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from . import utils

_SEEN = set()
_ENABLED = os.environ.get("ULA_PRECOMPILE", "1") != "0" and not utils.INTERPRET


def _sig(x):
    """What of an argument can change the kernels: a tensor's dtype, rank, last size, which sizes are multiples
    of 16 (Triton specializes integers on it), whether it needs a gradient; anything else as it is."""
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.dim(), x.shape[-1] if x.dim() else None, tuple(s % 16 == 0 for s in x.shape),
                x.requires_grad, x.device)
    return x


def grad_wanted(*tensors):
    """Whether the call's backward will run (as autograd will see it)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def compile_in_parallel(parts, q, thunk):
    """Before a call's first run with the configuration `parts` (its arguments): thunk() (its forward and, where
    wanted, backward) dry, the compiles in parallel."""
    if not _ENABLED or not q.is_cuda or torch.compiler.is_compiling():
        return
    key = tuple(_sig(x) for x in parts)
    if key in _SEEN:
        return
    _SEEN.add(key)
    try:
        from triton.runtime._async_compile import AsyncCompileMode, active_mode
    except ImportError:  # a Triton without it: compiles stay serial
        return
    if active_mode.get() is not None:  # someone else's parallel compile (torch inductor) is running
        return
    with ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:
        with AsyncCompileMode(pool, ignore_errors=True):
            dry(thunk)


def dry(thunk):
    """thunk() with every launch a compile request (utils.dry_launches), errors dropped."""
    with utils.dry_launches(), torch.no_grad():
        try:
            thunk()
        except Exception:  # noqa: BLE001  (best effort: the real call raises what is wrong)
            pass

