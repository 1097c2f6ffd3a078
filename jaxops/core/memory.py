"""Refusing a request that cannot fit before anything is allocated.

A ``size=`` of ``2**31 - 1``, a table of ``2**31`` slots or a golden case of ``100000 x
100000`` elements would otherwise end in XLA's ``RESOURCE_EXHAUSTED``, numpy's
``ArrayMemoryError`` or the kernel's OOM killer, long after the call. :func:`refuse_unless_fits`
compares the bytes a request needs with the memory the device can still give and raises
:class:`~jaxops.errors.ResourceRequestError` naming both.

The memory available is the device's ``bytes_limit - bytes_in_use`` where its backend
reports them (GPU, TPU), and otherwise (the CPU) the host's ``MemAvailable``: memory the
kernel can hand out without swapping.

>>> refuse_unless_fits("NonZero", "size", 1024)  # a kilobyte fits anywhere
>>> refuse_unless_fits("NonZero", "size", 1 << 62)
Traceback (most recent call last):
...
jaxops.core.errors.ResourceRequestError: NonZero: argument 'size': expected a request that fits in the ... bytes of memory available, got one needing 4611686018427387904 bytes (4.0 EiB). ...
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from jaxops.core.errors import ResourceRequestError

__all__ = ["SMALL_REQUEST", "available_bytes", "human_bytes", "refuse_unless_fits"]

# Below this a request is not checked: asking the device for its statistics costs more than
# the request, and anything smaller fails only where nothing else would run either.
SMALL_REQUEST = 64 << 20


def human_bytes(n: int) -> str:
    """``n`` bytes in binary units.

    >>> human_bytes(3 << 30), human_bytes(512)
    ('3.0 GiB', '512 B')
    """
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        n /= 1024
        if n < 1024 or unit == "EiB":
            return f"{n:.1f} {unit}"


def available_bytes(devices: Iterable[Any] | None = None) -> int:
    """The bytes the least free of ``devices`` (default: JAX's first device) can still
    allocate: ``bytes_limit - bytes_in_use`` where the backend reports them, else the
    host's available memory.

    >>> available_bytes() > 0
    True
    """
    if devices is None:
        import jax

        devices = jax.devices()[:1]
    free = []
    for device in devices:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if not stats or not stats.get("bytes_limit"):
            return _host_available()
        free.append(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return min(free) if free else _host_available()


def _host_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # not Linux
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def refuse_unless_fits(op: str, argument: str, need: int, what: str = "",
                       devices: Iterable[Any] | None = None) -> None:
    """Raises :class:`~jaxops.errors.ResourceRequestError` unless ``need`` bytes fit in the
    memory ``devices`` have available (see :func:`available_bytes`).

    Args:
      op: the operator or function named in the error.
      argument: the argument that asked for the memory (``size``, ``capacity``, ``shape``).
      need: the bytes the request needs.
      what: what those bytes hold, for the error (e.g. ``"the [1, 2147483647] int32 result"``).
      devices: where the request allocates; default JAX's first device.
    """
    if need < SMALL_REQUEST:
        return
    have = available_bytes(devices)
    if need > have:
        held = f" ({what})" if what else ""
        raise ResourceRequestError(
            op, argument, f"a request that fits in the {have} bytes of memory available",
            f"one needing {need} bytes ({human_bytes(need)}){held}",
            "Ask for less, or run where more memory is free.")
