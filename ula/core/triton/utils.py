"""Small shared pieces of the Triton backend: output allocation, block sizes, the dot with the right precision."""
import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _interpreter_index_shim():
    """Triton's interpreter keeps scalars as 1-element arrays and turns them into loop bounds with int(array),
    which NumPy >= 2.4 refuses ("only 0-dimensional arrays can be converted"): every range() with a runtime
    bound fails. Under the interpreter only, and only when NumPy refuses, convert through the single element."""
    import numpy as np
    try:
        int(np.zeros(1, dtype=np.int32))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter
    orig = getattr(interpreter, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_ula_shim", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._ula_shim = True
    interpreter._patch_lang_tensor = patched


if INTERPRET:
    _interpreter_index_shim()

# operand type of tl.dot: 0 float32 ("ieee", no tf32), 1 float16, 2 bfloat16 (float32 accumulate in every case)
DOT_F32, DOT_F16, DOT_BF16 = 0, 1, 2


def alloc(shape, device, dtype=torch.float32):
    """Every output buffer of the kernels comes from here: NaN-filled when ULA_POISON_OUTPUTS=1 (tests), so an
    element that no kernel writes cannot pass a comparison."""
    if os.environ.get("ULA_POISON_OUTPUTS") == "1":
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def block(n, cap, lo=16):
    """Power-of-two tile size for a dimension n: at least lo (tl.dot needs 16), at most cap; masks cover the rest."""
    return max(lo, min(cap, triton.next_power_of_2(n)))


def dot_code(*tensors):
    """Half-precision matmul operands when any input is half precision; float32 otherwise. Under the interpreter
    bfloat16 is not trusted, so its tiles stay in float32 there."""
    dts = {t.dtype for t in tensors}
    if torch.bfloat16 in dts:
        return DOT_F32 if INTERPRET else DOT_BF16
    if torch.float16 in dts:
        return DOT_F16
    return DOT_F32


@triton.jit
def cast_dot(x, DOT: tl.constexpr):
    if DOT == 1:
        return x.to(tl.float16)
    elif DOT == 2:
        return x.to(tl.bfloat16)
    else:
        return x


@triton.jit
def operand(x, DOT: tl.constexpr):
    """A loaded tile as a matmul operand: kept in its own (half) precision when the dot takes half precision,
    float32 otherwise (no float32 round trip for tiles that go straight into a dot)."""
    if DOT == 0:
        return x.to(tl.float32)
    else:
        return x


@triton.jit
def mm(a, b, DOT: tl.constexpr):
    """a @ b with float32 accumulation; float32 operands in full precision (no tf32)."""
    if DOT == 0:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(cast_dot(a, DOT), cast_dot(b, DOT))


def tuned(kernel, defaults):
    """Tile sizes and warps of a kernel: the heuristic defaults, or ULA_TUNE_<KERNEL>="a,b,c,..." (same order)
    for measurement sweeps (benchmarks/gpu_tile_sweep.py)."""
    env = os.environ.get(f"ULA_TUNE_{kernel.upper()}")
    return tuple(int(x) for x in env.split(",")) if env else defaults
