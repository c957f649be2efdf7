"""`ula train` / `ula generate`: byte-level causal LM training with exact resume."""
from .checkpoint import CheckpointError
from .data import DataError, load_corpus
from .errors import ConfigError, OutputError, UsageError
from .loop import train
from .schedule import lr_factor

__all__ = ["train", "load_corpus", "lr_factor", "UsageError", "DataError", "CheckpointError", "ConfigError",
           "OutputError"]
