"""torch.nn token mixers as the papers define them, each a thin use of `ula.ops`.

Every mixer has `forward(x [B, T, d], state=None, cu_seqlens=None) -> (y, new_state)` (the chunk path
over a whole sequence) and `step(x_t [B, d], state) -> (y_t, new_state)` (one-token decoding with the
ops' `*_step` functions). `MIXERS` maps a name to a constructor `(d_model, n_heads, **kwargs)`."""
from functools import partial

from ._base import Mixer, RMSNorm, set_cp_group, softcap
from .gla import GLALayer
from .gsa import GSALayer
from .hgrn2 import HGRN2Layer
from .linear import LinearAttentionLayer
from .mamba2 import Mamba2Layer
from .mlstm import MLSTMLayer
from .normalized import NormalizedLinearAttentionLayer
from .retnet import RetNetLayer
from .softmax import SoftmaxAttentionLayer

MIXERS = {
    "gla": GLALayer,
    "gsa": GSALayer,
    "mlstm_exp": partial(MLSTMLayer, variant="exp"),
    "mlstm_sig": partial(MLSTMLayer, variant="sig"),
    "linear": LinearAttentionLayer,
    "retnet": RetNetLayer,
    "mamba2": Mamba2Layer,
    "hgrn2": HGRN2Layer,
    "normalized": NormalizedLinearAttentionLayer,
    "softmax": SoftmaxAttentionLayer,
}
LINEAR_MIXERS = tuple(n for n in MIXERS if n != "softmax")
# the mixers whose ops take a cp_group (set_cp_group, ula train --context-parallel)
CP_MIXERS = tuple(n for n, c in MIXERS.items() if getattr(getattr(c, "func", c), "context_parallel", False))


def build_mixer(name, d_model, n_heads, **kwargs):
    """The mixer `name` of MIXERS, e.g. build_mixer("gla", 256, 4, tau=16)."""
    if name not in MIXERS:
        raise ValueError(f"unknown mixer {name!r}; choose one of {sorted(MIXERS)}")
    return MIXERS[name](d_model, n_heads, **kwargs)


__all__ = ["MIXERS", "LINEAR_MIXERS", "build_mixer", "Mixer", "RMSNorm", "set_cp_group", "softcap", "GLALayer",
           "GSALayer", "MLSTMLayer", "LinearAttentionLayer", "RetNetLayer", "Mamba2Layer", "HGRN2Layer",
           "NormalizedLinearAttentionLayer", "SoftmaxAttentionLayer"]
