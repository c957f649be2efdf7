"""Triton backend of the chunked recurrence F (DESIGN §2): three kernels, one job each.

    cumsum.py  chunk-local cumulative log decays (reverse: shifted by one step)
    step.py    one decoding step (decay, outer product, output) in one kernel
    state.py   the states at the chunk borders, sequential over chunks
    output.py  inter-chunk (through the entering state) + intra-chunk output, tiled, secondary chunking
    chunk.py   chunk_recurrence_triton: layout (varlen chunk tables), dispatch
"""
from .chunk import chunk_recurrence_triton

__all__ = ["chunk_recurrence_triton"]
