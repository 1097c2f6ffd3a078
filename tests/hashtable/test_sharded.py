"""Sharded hash tables on 8 host devices: the checks the placement matrix does not hold
(``tests/helpers/sharded_checks.py``), each its own test.

They run in the 8-device child (``tests/helpers/eight_devices.py``: one process with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, started when collection finds them,
beside the other tests); each test here reads its check's result. Among them, a run of two
processes (``jax.distributed`` with gloo, 4 devices each: ``sharded_multiprocess.py``)
trains a table and its optimizer state with a jitted, donated step, saves and restores it;
the child then restores those checkpoints in a fresh process (onto 4 shards against one
unsharded table, and resumed on 2 shards).
"""

import pytest

from tests.helpers import eight_devices
from tests.helpers import sharded_checks as checks


@pytest.mark.parametrize("check", [pytest.param(fn.__name__, marks=pytest.mark.eight_devices(
    fn.__name__)) for fn in checks.CHECKS])
def test_check(check):
    eight_devices.assert_passed(check)
