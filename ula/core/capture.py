"""Whether a CUDA graph is being captured on this thread's current stream. Kernels are then recorded, not run: a
tensor made during a capture holds its values only once the graph is replayed, so what is kept for later calls (the
cu_seqlens layouts, a layer's fixed decays) must not be made then."""
import torch


def capturing():
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
