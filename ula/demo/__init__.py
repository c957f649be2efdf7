"""`ula demo`: multi-query associative recall (MQAR) with every mixer at equal width."""
from .mqar import IGNORE, accuracy, mqar_batch
from .runner import DEMO_MIXERS, TINY, DemoConfig, format_table, run_demo

__all__ = ["mqar_batch", "accuracy", "IGNORE", "DemoConfig", "TINY", "DEMO_MIXERS", "run_demo", "format_table"]
