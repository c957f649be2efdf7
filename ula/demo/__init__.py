"""`ula demo`: multi-query associative recall (MQAR) with the chosen mixers at equal width (by default eight:
DEMO_MIXERS; `--mixers` takes any of ula.layers.MIXERS)."""
from .mqar import IGNORE, accuracy, mqar_batch
from .runner import DEMO_MIXERS, TINY, DemoConfig, format_table, run_demo

__all__ = ["mqar_batch", "accuracy", "IGNORE", "DemoConfig", "TINY", "DEMO_MIXERS", "run_demo", "format_table"]
