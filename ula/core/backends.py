"""Which implementation of the chunk function F runs: Triton kernels on CUDA, the PyTorch path elsewhere."""
import os
import re
import warnings

import torch

from .chunk_torch import chunk_recurrence

# The oldest Triton whose compiler takes ula's kernels (checked for Triton 3.2 to 3.9 by scripts/triton_versions.sh:
# 3.3 refuses chained boolean operators in kernels, 3.2 and 3.3 lack `triton.knobs`). torch >= 2.8 comes with one.
MIN_TRITON = (3, 4)
_WARNED = set()


def _version(text):
    """'3.4.0+git1234' -> (3, 4)."""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


_PROBLEM = []  # the answer, found once per process: every call of an op asks


def triton_problem():
    """None where a Triton that ula's kernels support is installed; otherwise why not, in words."""
    if not _PROBLEM:
        _PROBLEM.append(_find_triton_problem())
    return _PROBLEM[0]


def _find_triton_problem():
    try:
        import triton
    except ImportError as e:
        return f"Triton is not installed ({e})"
    found = getattr(triton, "__version__", "unknown")
    if _version(found) < MIN_TRITON:
        want = ".".join(map(str, MIN_TRITON))
        return (f"Triton {found} is installed and ula's kernels need Triton >= {want} "
                f"(pip install 'triton>={want}', or torch >= 2.8, which brings one)")
    return None


triton_problem()  # now, so that a torch.compile trace only reads the answer (torch 2.11's Dynamo cannot trace `re`)


# GPUs before Ampere (compute capability < 8.0: V100, T4, RTX 20xx): Triton compiles every kernel for them, but in
# half precision the compile report spills up to 71 KB of registers per thread (benchmarks/results/
# offline_compile_sm70_triton3.6.0.txt, and _sm75_); no such GPU was ever measured.
_GPUS_SEEN = set()
_CAPABILITY = {}


def _index(device):
    return device.index if device.index is not None else torch.cuda.current_device()


def capability(device):
    """(major, minor) compute capability of a CUDA device, asked of the driver once per GPU (the launches ask on every
    call: utils.tuned_here)."""
    idx = _index(device)
    cap = _CAPABILITY.get(idx)
    if cap is None:
        cap = _CAPABILITY[idx] = tuple(torch.cuda.get_device_capability(idx))
    return cap


_H200 = {}


def is_h200(device):
    """Whether a device is an H200, asked of the driver once per GPU: sm_90 and 132 multiprocessors as the H100, with
    about 1.4x its memory bandwidth, where a few tile choices measured faster than the H100's (RESULTS.md
    session 40)."""
    if device.type != "cuda":
        return False
    idx = _index(device)
    known = _H200.get(idx)
    if known is None:
        known = _H200[idx] = "H200" in torch.cuda.get_device_name(idx)
    return known


def _check_gpu(device):
    """Warns once per GPU older than Ampere: the kernels run there, but were tuned for newer GPUs."""
    idx = _index(device)
    if idx in _GPUS_SEEN:
        return
    _GPUS_SEEN.add(idx)
    major, minor = capability(device)
    if major < 8:
        warnings.warn(f"ula: {torch.cuda.get_device_name(idx)} (compute capability {major}.{minor}) is older than the "
                      "GPUs ula's Triton kernels are tuned for (8.0 and newer): they run, but compiled for it they "
                      "spill registers heavily in half precision; compare backend='torch' for speed",
                      RuntimeWarning, stacklevel=3)


def _fallback(problem):
    """backend='auto' on CUDA without usable kernels: the PyTorch path, said once per reason (it is much slower)."""
    if problem not in _WARNED:
        _WARNED.add(problem)
        warnings.warn(f"ula: running the PyTorch path on CUDA, not the Triton kernels: {problem}", RuntimeWarning,
                      stacklevel=3)
    return chunk_recurrence


def chunk_fn(backend, device):
    """F for backend "auto" | "torch" | "triton" | "reference" on this device ("reference": the PyTorch F for what the
    families run around the core, whose own call then takes the float64 recurrence)."""
    if backend in ("torch", "reference") or (backend == "auto" and device.type != "cuda"):
        return chunk_recurrence
    problem = triton_problem()
    if problem is None:
        try:
            from .triton import chunk_recurrence_triton
        except ImportError as e:
            problem = f"its kernels could not be loaded ({e})"
    if problem is not None:
        if backend == "triton":
            raise RuntimeError(f"backend='triton' needs ula's Triton kernels: {problem}; or use backend='torch'")
        return _fallback(problem)
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"backend='triton' needs CUDA tensors (got {device}); set TRITON_INTERPRET=1 "
                           "before importing ula to run the kernels on the CPU, or use backend='torch'")
    if device.type == "cuda" and not torch.compiler.is_compiling():  # (a trace: the eager calls warn)
        _check_gpu(device)
    return chunk_recurrence_triton


def runs_triton(backend, device):
    """Whether the core runs the Triton kernels for this backend and device (errors as `chunk_fn`)."""
    return chunk_fn(backend, device) is not chunk_recurrence


def runs_fused(backend, device):
    """Whether a family's own fused autograd Functions on Triton kernels serve this call: the core runs Triton and
    no torch.compile trace is in progress (those Functions are opaque to it; a trace takes the PyTorch forms)."""
    return runs_triton(backend, device) and not torch.compiler.is_compiling()
