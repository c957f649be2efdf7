"""The demo's model: `ula.models.CausalLM` with a token shift at the input.

    h_t = E[x_t] + P[x_{t-1}]          (P: a second embedding table, of the previous token)

The shift (what the short convolutions of the Zoology models provide) lets every mixer bind a value to
the key just before it in one layer, so two layers suffice for recall and the comparison measures how
each mixer stores and reads the pairs. The softmax baseline gets the same shift."""
import torch.nn as nn
import torch.nn.functional as F

from ..models import CausalLM, LMConfig


class ShiftEmbedding(nn.Module):
    context_parallel = False  # the previous token of a slice's first lies on another rank (set_cp_group refuses it)

    def __init__(self, embed, init_std=0.02):
        super().__init__()
        self.embed = embed
        self.prev = nn.Embedding(embed.num_embeddings, embed.embedding_dim)
        nn.init.normal_(self.prev.weight, 0.0, init_std)

    def forward(self, ids):
        e = self.embed(ids)
        if ids.dim() == 1:        # one decoding step: not used by the demo
            return e
        return e + F.pad(self.prev(ids[:, :-1]), (0, 0, 1, 0))


def demo_model(mixer, vocab_size, d_model, n_layers, n_heads, mixer_kwargs=None, shift=True, init_std=None):
    """init_std None: d_model^-1/2 (at 0.02 and this small width the gated outputs, Swish(W x) ⊙ o, start
    so small that GLA and RetNet sit on the loss plateau for hundreds of steps)."""
    cfg = LMConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads, mixer=mixer,
                   mlp_ratio=2.0, mixer_kwargs=dict(mixer_kwargs or {}),
                   init_std=d_model ** -0.5 if init_std is None else init_std)
    model = CausalLM(cfg)
    if shift:
        model.embed = ShiftEmbedding(model.embed, cfg.init_std)
    return model
