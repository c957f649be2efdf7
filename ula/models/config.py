"""Configuration of the causal LM (`ula.models.CausalLM`)."""
import json
from dataclasses import asdict, dataclass, field, fields


@dataclass
class LMConfig:
    """vocab_size, d_model, n_layers, n_heads: the usual. mixer: a key of `ula.layers.MIXERS`.
    mlp_ratio: SwiGLU hidden size = round_up(mlp_ratio · d_model, mlp_multiple_of).
    tie_embeddings: share the embedding with the LM head. logit_softcap: cap · tanh(logits / cap)
    (30 in paper 003, App. E.2), None for none. mixer_kwargs: passed to the mixer's constructor."""
    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mixer: str = "gla"
    mlp_ratio: float = 8 / 3
    mlp_multiple_of: int = 8
    tie_embeddings: bool = False
    logit_softcap: float | None = None
    norm_eps: float = 1e-6
    init_std: float = 0.02
    mixer_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_multiple_of"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"LMConfig: {name} must be a positive int, got {x!r}")
        for name in ("mlp_ratio", "norm_eps", "init_std"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < float("inf"):
                raise ValueError(f"LMConfig: {name} must be a finite number > 0, got {x!r}")
        cap = self.logit_softcap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < float("inf")):
            raise ValueError(f"LMConfig: logit_softcap must be None (no cap) or a finite number > 0, got {cap!r}")

    @property
    def mlp_hidden(self):
        m = self.mlp_multiple_of
        return -(-int(self.mlp_ratio * self.d_model) // m) * m

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown LMConfig fields {sorted(unknown)}")
        return cls(**d)

    def save(self, path):
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls.from_dict(json.load(f))
