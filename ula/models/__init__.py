"""A small causal LM over any `ula.layers` mixer, with recurrent-state generation.
`ula.models.hf` (imported on demand) wraps it for Hugging Face transformers."""
from .config import LMConfig
from .lm import Block, CausalLM, StateCache, StaticStateCache, SwiGLU, sample_next

__all__ = ["LMConfig", "CausalLM", "StateCache", "StaticStateCache", "Block", "SwiGLU", "sample_next"]
