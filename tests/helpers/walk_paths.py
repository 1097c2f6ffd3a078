"""Runs a test's table calls on the native walks or forced to xla, each traced for its path.

The walks are chosen when a function is traced, and jax keeps one trace per default-device
setting: the xla runs name the one CPU as the default device, the native runs leave it
unset, so each path gets its own traces and keeps them for the next test (cheaper than
``jax.clear_caches()``, which throws away every program of the process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import jax

from jaxops import native
from jaxops.core import walk_table
from jaxops.core.backend_table import use_backend

T = TypeVar("T")
#: The paths a test runs on: the native walks where the library is built, and xla.
PATHS = ["native", "xla"] if native.available() else ["xla"]


def on_path(path: str, fn: Callable[[], T]) -> T:
    """``fn()`` with the walks on ``path`` (``"native"`` or ``"xla"``), traced for it."""
    if path == "xla":
        with use_backend("xla"), jax.default_device(jax.devices("cpu")[0]):
            assert walk_table.walk_path()[0] == "xla"
            return fn()
    if path != "native":
        raise ValueError(f"on_path: argument 'path': expected 'native' or 'xla', got {path!r}")
    with use_backend("auto"):
        assert walk_table.walk_path()[0] == "native", walk_table.walk_path()
        return fn()
