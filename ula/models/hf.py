"""Hugging Face transformers integration (needs `transformers`; ula itself does not).

    import ula.models.hf          # registers model_type "ula" with AutoConfig / AutoModelForCausalLM
    from transformers import AutoConfig, AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("ula", mixer="gla", d_model=256))
    model.generate(input_ids, max_new_tokens=20, do_sample=False)

`UlaForCausalLM` wraps `ula.models.CausalLM` (as `.model`); its cache is ula's `StateCache` (fixed-size
recurrent states for the linear mixers), so `generate` prefills with the chunk path and then runs one
recurrent step per token. forward takes the cache as `cache=` (transformers >= 5) or `past_key_values=`
(4.x) and returns it under the name of the installed transformers' outputs. Padding (attention_mask with
zeros) is not supported."""
import dataclasses

import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .config import LMConfig
from .lm import CausalLM, StateCache

_DATACLASS_CONFIG = dataclasses.is_dataclass(PretrainedConfig)   # transformers >= 5
# transformers 5 renamed the outputs' cache field to `cache`; generate reads the cache back under this name
_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "mixer", "mlp_ratio", "mlp_multiple_of",
           "logit_softcap", "norm_eps", "init_std", "mixer_kwargs")


class UlaConfig(PretrainedConfig):
    """The fields of `ula.models.LMConfig`; tie_embeddings is HF's `tie_word_embeddings`."""
    model_type = "ula"

    if _DATACLASS_CONFIG:
        vocab_size: int = 256
        d_model: int = 256
        n_layers: int = 4
        n_heads: int = 4
        mixer: str = "gla"
        mlp_ratio: float = 8 / 3
        mlp_multiple_of: int = 8
        logit_softcap: float | None = None
        norm_eps: float = 1e-6
        init_std: float = 0.02
        mixer_kwargs: dict | None = None
        tie_word_embeddings: bool = False
    else:  # transformers 4.x
        def __init__(self, vocab_size=256, d_model=256, n_layers=4, n_heads=4, mixer="gla", mlp_ratio=8 / 3,
                     mlp_multiple_of=8, logit_softcap=None, norm_eps=1e-6, init_std=0.02, mixer_kwargs=None,
                     tie_word_embeddings=False, **kwargs):
            self.vocab_size, self.d_model, self.n_layers, self.n_heads = vocab_size, d_model, n_layers, n_heads
            self.mixer, self.mlp_ratio, self.mlp_multiple_of = mixer, mlp_ratio, mlp_multiple_of
            self.logit_softcap, self.norm_eps, self.init_std = logit_softcap, norm_eps, init_std
            self.mixer_kwargs = mixer_kwargs
            super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def to_lm_config(self):
        d = {f: getattr(self, f) for f in _FIELDS}
        d["mixer_kwargs"] = dict(d["mixer_kwargs"] or {})
        return LMConfig(tie_embeddings=bool(self.tie_word_embeddings), **d)

    @classmethod
    def from_lm_config(cls, cfg: LMConfig, **kwargs):
        d = {f: getattr(cfg, f) for f in _FIELDS}
        return cls(tie_word_embeddings=cfg.tie_embeddings, **d, **kwargs)


class UlaForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = UlaConfig
    base_model_prefix = "ula"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _is_stateful = True   # recurrent states: no rewinding the cache (assisted decoding, beam reordering)
    # used only when config.tie_word_embeddings (v5 wants target -> source, v4 a list of the tied keys)
    _tied_weights_keys = ({"model.lm_head.weight": "model.embed.weight"} if _DATACLASS_CONFIG
                          else ["model.lm_head.weight"])

    def __init__(self, config: UlaConfig):
        super().__init__(config)
        self.model = CausalLM(config.to_lm_config())
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False   # the cache is ula's StateCache, made by forward

    def _init_weights(self, module):
        if isinstance(module, CausalLM):
            module.reset_parameters()

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value):
        self.model.lm_head = value

    def forward(self, input_ids=None, cache=None, attention_mask=None, labels=None, use_cache=None,
                return_dict=None, past_key_values=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("UlaForCausalLM does not support padding (attention_mask with zeros): the recurrent "
                             "state would absorb the pad tokens. Generate rows of equal length.")
        cache = _state_cache(cache, past_key_values)
        logits, new_cache = self.model(input_ids, cache)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      **{_CACHE: new_cache if use_cache is not False else None})

    def prepare_inputs_for_generation(self, input_ids, cache=None, attention_mask=None, use_cache=True,
                                      past_key_values=None, **kwargs):
        cache = _state_cache(cache, past_key_values)
        if cache is not None:
            input_ids = input_ids[:, cache.seen_tokens:]   # only the tokens the cache has not seen
        return {"input_ids": input_ids, _CACHE: cache, "attention_mask": attention_mask, "use_cache": use_cache}


def _state_cache(cache, past_key_values):
    """The StateCache given under either name (transformers 5 passes `cache`, 4.x `past_key_values`), else None:
    anything else (an empty HF Cache) means no past."""
    for c in (cache, past_key_values):
        if isinstance(c, StateCache):
            return c
    return None


def register():
    """Registers "ula" with AutoConfig and AutoModelForCausalLM (done on import of this module)."""
    AutoConfig.register("ula", UlaConfig, exist_ok=True)
    AutoModelForCausalLM.register(UlaConfig, UlaForCausalLM, exist_ok=True)


register()
