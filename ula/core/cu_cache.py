"""What a cu_seqlens tensor yields, computed once per tensor: its values on the host, and the layouts built from them.

Reading a CUDA tensor's values on the host waits for everything queued on the GPU before it. Each packed call read
cu_seqlens several times: the argument checks, the chunk layout of each pass, the decay gradient's layout, the
families' per-sequence scans. So every layer's forward and backward stalled the host until the GPU caught up. A
model's layers share one cu_seqlens tensor per step, so the values are now read once per tensor and reused, as long as
that tensor is alive and unmodified (its version counter: any in-place write to it bumps it). Writes that bypass the
counter (through `.data`, or through a NumPy view of a CPU tensor) are not seen: pass a new tensor instead. Tensors
made under torch.inference_mode() have no version counter and are read every time. A packed call captured in a CUDA
graph (possible once its cu_seqlens was read before the capture) keeps the layout of the capture in every replay, as
a graph keeps every size: capture again for other boundaries. A layout first built during a capture is not kept:
its tensors hold values only once the graph is replayed, so a call after the capture builds its own.

Inside `fresh()` nothing is taken from the cache or kept in it. torch.compile's CUDA graphs (mode="reduce-overhead")
need it: where a graph consumes cu_seqlens, the ops run between graphs get the graph's copy of it, one tensor whose
memory each call rewrites without bumping its version counter (ula/core/custom_ops.py)."""
import contextlib
import threading
import weakref

from . import capture

_ENTRIES = {}  # id(tensor) -> (weak reference, version, {key: value})
_FRESH = threading.local()


@contextlib.contextmanager
def fresh(on=True):
    """With on: every value inside is built from cu_seqlens' values as they are now, and not kept."""
    before = getattr(_FRESH, "on", False)
    _FRESH.on = before or on
    try:
        yield
    finally:
        _FRESH.on = before


def _version(cu):
    try:
        return cu._version
    except RuntimeError:  # an inference tensor: no version counter, so nothing can be cached for it
        return None


def cached(cu, key, build, on_device=True):
    """build(), computed once per (cu_seqlens tensor, key) while the tensor lives unmodified. The value must not hold
    a reference to cu itself (the entry would keep the tensor alive). on_device: the value holds tensors that kernels
    fill, not kept when built during a CUDA graph capture (they are filled only by the graph's replays)."""
    version = _version(cu)
    if version is None or getattr(_FRESH, "on", False) or (on_device and capture.capturing()):
        return build()
    entry = _ENTRIES.get(id(cu))
    if entry is None or entry[0]() is not cu or entry[1] != version:
        ref = weakref.ref(cu, lambda _, i=id(cu): _ENTRIES.pop(i, None))
        entry = _ENTRIES[id(cu)] = (ref, version, {})
    values = entry[2]
    if key not in values:
        values[key] = build()
    return values[key]


def _read(cu):
    return tuple(cu.tolist())


def host_values(cu):
    """cu_seqlens' values as a tuple of ints, read from the device once per tensor."""
    def read():
        if cu.device.type == "cuda" and capture.capturing():  # reading would wait for the GPU, which a capture forbids
            raise RuntimeError("cu_seqlens: its values are read on the host once per tensor, which cannot happen "
                               "during a CUDA graph capture; call the op once eagerly with this cu_seqlens tensor "
                               "before capturing (its values are kept for the capture)")
        return _read(cu)
    return cached(cu, "host", read, on_device=False)
