"""One small module per family, each a thin use of `ula.core` (DESIGN §3).

Every op returns (o, final_state) and has a `*_step` twin that decodes one token at a time from the state
the op returns (prefill with output_final_state=True, then step)."""
from ._common import recurrent_step
from .conveniences import (hgrn2, hgrn2_step, linear_attn, linear_attn_step, mamba2, mamba2_step, retention,
                           retention_step, retnet_log_decay)
from .gla import gla, gla_step
from .gsa import abc, abc_step, gsa, gsa_step
from .mlstm import mlstm, mlstm_step
from .normalized import normalized_linear_attention, normalized_linear_attention_step

__all__ = ["gla", "gla_step", "mlstm", "mlstm_step", "normalized_linear_attention",
           "normalized_linear_attention_step", "gsa", "gsa_step", "abc", "abc_step", "linear_attn",
           "linear_attn_step", "retention", "retention_step", "retnet_log_decay", "mamba2", "mamba2_step",
           "hgrn2", "hgrn2_step", "recurrent_step"]
