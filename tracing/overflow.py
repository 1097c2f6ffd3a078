"""Deprecated import path, kept for one release: use :mod:`jaxops.capacity` (the overflow
policies live in :mod:`jaxops.capacity.policy`).

>>> from tracing import overflow
>>> from jaxops.capacity import policy
>>> overflow.run_with_policy is policy.run_with_policy
True
"""

from jaxops.capacity.policy import (EXPAND_POLICY_ARGS, POLICIES, check_overflow, check_policy,
                                    documents_policy_args, next_capacity, reset_warnings,
                                    run_with_policy, warn_once)
from jaxops.core.errors import CapacityOverflowWarning

__all__ = [
    "EXPAND_POLICY_ARGS", "POLICIES", "CapacityOverflowWarning", "check_overflow",
    "check_policy", "documents_policy_args", "next_capacity", "reset_warnings",
    "run_with_policy", "warn_once",
]
