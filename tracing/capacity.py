"""Deprecated import path, kept for one release: use :mod:`jaxops.capacity` (the statistics
live in :mod:`jaxops.capacity.stats`).

>>> from tracing import capacity
>>> from jaxops.capacity import stats
>>> capacity.CapacityStats is stats.CapacityStats
True
"""

from jaxops.capacity.stats import (CapacityMetrics, CapacityStats, all_stats, clear_stats,
                                   dyn_size, get_stats, metrics, plot, record_in_jit,
                                   record_tree, recommend, report, site_key)

__all__ = [
    "CapacityMetrics", "CapacityStats", "all_stats", "clear_stats", "dyn_size", "get_stats",
    "metrics", "plot", "record_in_jit", "record_tree", "recommend", "report", "site_key",
]
