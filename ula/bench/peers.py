"""Peer kernels, in this process, for whichever peers are installed: fla (`fla-core`), mlstm-kernels,
lightning-attn, and PyTorch SDPA (flash attention on a GPU; its CPU kernel elsewhere). Each maker
returns (fn, args) for the same shapes and inputs as `measure.ours`, or raises ImportError.
`PEERS[kind]` lists (name, maker) of peers that compute what our decay kind computes; "softmax" is
the quadratic reference."""
import torch
import torch.nn.functional as F


def _r(shape, dev, dt, sc=1.0):
    return (torch.randn(*shape, device=dev, dtype=dt) * sc).requires_grad_()


def _qkv(B, T, H, K, V, dev, dt, heads_first=False):
    s = (lambda D: (B, H, T, D)) if heads_first else (lambda D: (B, T, H, D))
    return [_r(s(K), dev, dt, K ** -0.5), _r(s(K), dev, dt, K ** -0.5), _r(s(V), dev, dt)]


def sdpa(B, T, H, K, V, dev, dt):
    q, k, v = (_r((B, H, T, K), dev, dt) for _ in range(3))
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]


def fla_linear(B, T, H, K, V, dev, dt):
    from fla.ops.linear_attn import chunk_linear_attn
    return (lambda q, k, v: chunk_linear_attn(q, k, v, normalize=False)[0]), _qkv(B, T, H, K, V, dev, dt)


def fla_simple_gla_const(B, T, H, K, V, dev, dt):
    from fla.ops.simple_gla import chunk_simple_gla
    g = -torch.arange(1, H + 1, device=dev, dtype=torch.float32) / H
    return (lambda q, k, v: chunk_simple_gla(q, k, v, g_gamma=g)[0]), _qkv(B, T, H, K, V, dev, dt)


def lightning_const(B, T, H, K, V, dev, dt):
    from lightning_attn.ops import lightning_attn_func
    if K != V or K > 128:
        raise ImportError("lightning-attn needs K == V <= 128")
    slope = torch.tensor([2 ** (-(8 / H) * (h + 1)) for h in range(H)], device=dev, dtype=torch.float32).view(H, 1, 1)
    return (lambda q, k, v: lightning_attn_func(q, k, v, slope)), _qkv(B, T, H, K, V, dev, dt, heads_first=True)


def fla_simple_gla_scalar(B, T, H, K, V, dev, dt):
    from fla.ops.simple_gla import chunk_simple_gla
    g = F.logsigmoid(torch.randn(B, T, H, device=dev, dtype=torch.float32) + 4).requires_grad_()
    return (lambda q, k, v, g: chunk_simple_gla(q, k, v, g=g)[0]), _qkv(B, T, H, K, V, dev, dt) + [g]


def mlstm_sig(B, T, H, K, V, dev, dt):
    from mlstm_kernels.torch import get_mlstm_kernel
    kern = get_mlstm_kernel("chunkwise--triton_xl_chunk_siging")
    i = (torch.randn(B, H, T, device=dev, dtype=dt) - 2).requires_grad_()
    f = (torch.randn(B, H, T, device=dev, dtype=dt) + 4).requires_grad_()
    args = _qkv(B, T, H, K, V, dev, dt, heads_first=True) + [i, f]
    return (lambda q, k, v, i, f: kern(q, k, v, i, f, chunk_size=128, autocast_kernel_dtype=dt)), args


def fla_gla(B, T, H, K, V, dev, dt):
    from fla.ops.gla import chunk_gla
    g = F.logsigmoid(torch.randn(B, T, H, K, device=dev, dtype=torch.float32) + 4).requires_grad_()
    return (lambda q, k, v, g: chunk_gla(q, k, v, g)[0]), _qkv(B, T, H, K, V, dev, dt) + [g]


PEERS = {"none": [("fla_chunk_linear_attn", fla_linear)],
         "constant": [("fla_chunk_simple_gla_const", fla_simple_gla_const), ("lightning_attn2_const", lightning_const)],
         "scalar": [("tfla_mlstm_sig_xl_chunk128", mlstm_sig), ("fla_chunk_simple_gla_scalar", fla_simple_gla_scalar)],
         "vector": [("fla_chunk_gla_vector", fla_gla)],
         "softmax": [("sdpa_causal", sdpa)]}
GPU_ONLY = {name for kind, lst in PEERS.items() for name, _ in lst if kind != "softmax"}


def installed():
    """{peer package: version or None} for the peers this environment has."""
    import importlib.metadata as md
    out = {}
    for dist in ("fla-core", "flash-linear-attention", "mlstm_kernels", "lightning_attn", "lightning-attn"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out
