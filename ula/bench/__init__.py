"""`ula bench`: timing ours against the peers (measurement shared with benchmarks/gpu_core_vs_peers.py)."""
from .measure import measure, measure_cpu, measure_on, ours

__all__ = ["measure", "measure_cpu", "measure_on", "ours"]
