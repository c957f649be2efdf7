"""Which implementation of the chunk function F runs: Triton kernels on CUDA, the PyTorch path elsewhere."""
import os

import torch

from .chunk_torch import chunk_recurrence


def chunk_fn(backend, device):
    """F for backend "auto" | "torch" | "triton" | "reference" on this device ("reference": the PyTorch F for what the
    families run around the core, whose own call then takes the float64 recurrence)."""
    if backend in ("torch", "reference") or (backend == "auto" and device.type != "cuda"):
        return chunk_recurrence
    try:
        from .triton import chunk_recurrence_triton
    except ImportError as e:
        if backend == "triton":
            raise RuntimeError(f"backend='triton' needs Triton kernels, which could not be loaded ({e}); "
                               "use backend='torch'") from e
        return chunk_recurrence
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"backend='triton' needs CUDA tensors (got {device}); set TRITON_INTERPRET=1 "
                           "before importing ula to run the kernels on the CPU, or use backend='torch'")
    return chunk_recurrence_triton


def runs_triton(backend, device):
    """Whether the core runs the Triton kernels for this backend and device (errors as `chunk_fn`)."""
    return chunk_fn(backend, device) is not chunk_recurrence


def runs_fused(backend, device):
    """Whether a family's own fused autograd Functions on Triton kernels serve this call: the core runs Triton and
    no torch.compile trace is in progress (those Functions are opaque to it; a trace takes the PyTorch forms)."""
    return runs_triton(backend, device) and not torch.compiler.is_compiling()
