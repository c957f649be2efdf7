"""A small causal LM over any `ula.layers` mixer, with recurrent-state generation.
`ula.models.hf` (imported on demand) wraps it for Hugging Face transformers."""
from .config import LMConfig
from .lm import Block, CausalLM, StateCache, SwiGLU, sample_next

__all__ = ["LMConfig", "CausalLM", "StateCache", "Block", "SwiGLU", "sample_next"]
