"""Parallel compilation of a core call's kernels on its first call (issue 3: a new shape's first call within
20 s). A forward+backward launches 10-25 distinct kernel configurations; Triton compiles each on first launch,
one after another (~1.5 s each for sm_90). Here the call is first run "dry": every launch becomes a compile
request (Triton's warmup, no kernel runs) handed to a thread pool through Triton's AsyncCompileMode, whose
compiles run mostly outside the GIL (MLIR/LLVM passes, ptxas). The real call then finds them compiled.

Best effort: the dry run's outputs are never read, a launch it misses (host code that reads a kernel's result)
is compiled serially by the real call as before, and any error inside it is dropped (the real call reports it).
Once per configuration key per process; skipped under the interpreter, while tracing, or when
ULA_PRECOMPILE=0."""
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from . import utils

_SEEN = set()
_ENABLED = os.environ.get("ULA_PRECOMPILE", "1") != "0" and not utils.INTERPRET


def _kind(x):
    """What of an optional tensor changes the kernels: absent, its shape's rank / last size, dtype, grad."""
    if x is None:
        return None
    return (x.dim(), x.shape[-1], x.dtype, x.requires_grad)


def _key(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, kg, grad):
    # sizes that reach the kernels as constexprs or specializations (divisibility by 16) and the optional parts
    B, T, H, K = q.shape
    return (q.device, q.dtype, k.dtype, v.dtype, H % 16 == 0, T % 16 == 0, K, v.shape[-1], _kind(ld), _kind(rd),
            _kind(h0), cu_seqlens is not None, reverse, chunk_size, _kind(kg), grad, B * T * H > 2 ** 31 // K)


def ensure_compiled(F, q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, kg):
    """Before a core call's first run with this configuration: its forward (and, where gradients will be asked,
    its backward) dry, the compiles in parallel."""
    if not _ENABLED or not q.is_cuda or torch.compiler.is_compiling():
        return
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, ld, rd, h0, kg))
    key = _key(q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, kg, grad)
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
            dry_run(F, q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, kg, grad)


def dry_run(F, q, k, v, ld, rd, h0, cu_seqlens, scale, reverse, chunk_size, kg, grad):
    """The call's forward (and backward, with grad) with every launch a compile request (utils.dry_launches)."""
    from ..autograd import backward_pass, forward_pass
    with utils.dry_launches(), torch.no_grad():
        try:
            o, _ = forward_pass(F, q, k, v, ld, rd, h0, scale, cu_seqlens, reverse, chunk_size, kg)
            if grad:
                need_ld = ld is not None and ld.requires_grad
                need_rd = rd is not None and rd.requires_grad
                backward_pass(F, q, k, v, ld, rd, h0, o if rd is not None else None, torch.empty_like(v), None,
                              scale, cu_seqlens, reverse, chunk_size, need_ld, need_rd, kg)
        except Exception:  # noqa: BLE001  (best effort: the real call raises what is wrong)
            pass
