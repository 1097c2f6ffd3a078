"""Capacity of data-dependent outputs: overflow policies and size statistics.

Below the operators, above the core: the operators import this package, and it imports only
:mod:`jaxops.core`.

- :mod:`jaxops.capacity.policy` — what an eager call does when its output exceeds its
  capacity (``error``, ``truncate``, ``expand``, ``host``), :func:`check_overflow` after jit;
- :mod:`jaxops.capacity.stats` — recorded output sizes per call site, recommended
  capacities, metrics, report and plot.

>>> from jaxops import capacity
>>> capacity.next_capacity(5, theoretical_max=100)
8
"""

from jaxops.capacity.policy import (EXPAND_POLICY_ARGS, POLICIES, check_overflow, check_policy,
                                    documents_policy_args, next_capacity, reset_warnings,
                                    run_with_policy, warn_once)
from jaxops.capacity.stats import (CapacityMetrics, CapacityStats, all_stats, clear_stats,
                                   dyn_size, get_stats, metrics, plot, record_in_jit,
                                   record_tree, recommend, report, site_key)
from jaxops.core.errors import CapacityOverflowWarning

__all__ = [
    "EXPAND_POLICY_ARGS", "POLICIES", "CapacityMetrics", "CapacityOverflowWarning",
    "CapacityStats", "all_stats", "check_overflow", "check_policy", "clear_stats",
    "documents_policy_args", "dyn_size", "get_stats", "metrics", "next_capacity", "plot",
    "record_in_jit", "record_tree", "recommend", "report", "reset_warnings",
    "run_with_policy", "site_key", "warn_once",
]
