"""Reading an Orbax checkpoint's arrays piece by piece, and refusing a checkpoint directory
that could make a restore read outside it or allocate more than it holds.

:class:`StoredArrays` opens the arrays Orbax wrote (OCDBT, through Orbax's own TensorStore
specs: the same format, read a slice at a time) so that a table is restored, and re-owned,
one chunk in memory at a time, each slice checked against the shape and dtype the
checkpoint's metadata lists and stored in chunks of at most twice
:data:`CHUNK_BYTES` (as jaxops writes them), so a crafted checkpoint cannot
make a read allocate more than that. What a restore allocates is the target's (the
checkpoint's shapes must equal it). :func:`check_directory` walks the checkpoint before
anything is read: only regular files and directories (no links, FIFOs or devices), so that
nothing outside it is read and nothing blocks.

>>> import numpy as np, jax.numpy as jnp, tempfile, os, orbax.checkpoint as ocp
>>> d = os.path.join(tempfile.mkdtemp(), "c")
>>> ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_compression=False)).save(
...     d, args=ocp.args.PyTreeSave({"x": jnp.arange(6.0).reshape(3, 2)}))
>>> StoredArrays(d, {"x": {"shape": [3, 2], "dtype": "float32"}}).read("x", (slice(1, 3),))
array([[2., 3.],
       [4., 5.]], dtype=float32)
"""

from __future__ import annotations

import ctypes
import os
import stat
from typing import Any

import numpy as np

from jaxops.core.errors import CheckpointError


__all__ = ["CHUNK_BYTES", "StoredArrays", "check_directory", "reading", "release_freed"]

#: The bytes of a checkpoint's chunks (Orbax's ``chunk_byte_size``, its OCDBT data files)
#: and of a restore's reads: the "one chunk" of a save's and a restore's extra memory.
#: TensorStore's read threads each keep a chunk or two resident (measured, 2^21 x 64
#: table: +80 MiB with 16 MiB chunks and its default concurrency, +47 MiB with one data
#: copy thread), so chunks are small and reads use one data-copy thread and one file-I/O
#: thread, and each chunk is written to the device before the next is read: a restore of
#: a 2^20 x 64 table beside two busy processes kept +24 to +68 MiB over the table with four
#: I/O threads and writes in flight (glibc gives contending threads their own heaps, which
#: keep freed chunks), -25 to +25 MiB in nine runs as it is now, about as fast.
CHUNK_BYTES = 4 << 20


def _trim():
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return lambda: None
    return lambda: trim(0)


#: Returns freed heap memory to the system. glibc raises its mmap threshold to the size of
#: the largest block freed, so chunk-sized buffers (read, decoded, copied to the device)
#: come from its heaps and stay resident after they are freed: reading a 277 MiB table
#: chunk by chunk kept +255 MiB resident, trimming after each chunk +20 MiB.
release_freed = _trim()


def check_directory(directory: str | os.PathLike) -> None:
    """Refuses ``directory`` if it holds anything but regular files and directories.

    Raises:
        CheckpointError: naming the entry.
    """
    directory = os.fspath(directory)
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise CheckpointError(f"{path!r}: not a regular file or directory (a link, "
                                      "FIFO or device): a checkpoint holds only files it wrote")


class StoredArrays:
    """The arrays of an Orbax checkpoint directory, read by slices (see the module
    docstring); ``leaves``: name → ``{"shape", "dtype"}`` as the metadata lists them."""

    def __init__(self, directory: str | os.PathLike, leaves: dict):
        self.directory = os.fspath(directory)
        self.leaves = leaves
        self._open: dict[str, Any] = {}
        self._context = None

    def open(self, name: str) -> None:
        """Opens the stored array ``name``, checking its shape, dtype and chunks against the
        metadata (an empty array is not stored)."""
        if 0 not in self.leaves[name]["shape"]:
            self._store(name)

    def _store(self, name: str):
        if name in self._open:
            return self._open[name]
        import orbax.checkpoint as ocp
        import tensorstore as ts
        from etils import epath

        if self._context is None:  # Orbax's (its 100 MB node cache cut to one chunk)
            self._context = ts.Context({"file_io_concurrency": {"limit": 1},
                                        "data_copy_concurrency": {"limit": 1},
                                        "cache_pool#ocdbt": {"total_bytes_limit": CHUNK_BYTES}})
        info = ocp.type_handlers.ParamInfo(name=name, parent_dir=epath.Path(self.directory),
                                           is_ocdbt_checkpoint=True, use_zarr3=False,
                                           ts_context=self._context)
        spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=True)
        with reading(self.directory, name):
            store = ts.open(spec, context=self._context, open=True, read=True).result()
        want = self.leaves[name]
        shape = tuple(store.chunk_layout.read_chunk.shape or ())
        if int(np.prod(shape, dtype=object)) * store.dtype.numpy_dtype.itemsize > 2 * CHUNK_BYTES:
            raise CheckpointError(f"{self.directory!r}: array {name!r} is stored in chunks of "
                                  f"{list(shape)} elements, more "
                                  f"than the {2 * CHUNK_BYTES} bytes jaxops writes")
        got_dtype = str(np.dtype(store.dtype.numpy_dtype))
        if list(store.shape) != list(want["shape"]) or got_dtype != want["dtype"]:
            raise CheckpointError(f"{self.directory!r}: array {name!r} is stored as "
                                  f"{list(store.shape)} {got_dtype}, its checksummed metadata "
                                  f"says {want['shape']} {want['dtype']} (a file swapped in "
                                  "from another checkpoint?)")
        self._open[name] = store
        return store

    def read(self, name: str, index: tuple) -> np.ndarray:
        """``array[index]`` of the stored array ``name``, as numpy (an empty array is not
        stored: Orbax refuses them)."""
        return self.read_many([name], index)[name]

    def read_many(self, names: list[str], index: tuple) -> dict[str, np.ndarray]:
        """``{name: array[index]}``, the reads issued together (their I/O overlaps)."""
        pending = {}
        for name in names:
            want = self.leaves[name]
            if 0 in want["shape"]:
                pending[name] = np.zeros(want["shape"], want["dtype"])[index]
            else:
                with reading(self.directory, name):
                    pending[name] = self._store(name)[index].read()
        out = {}
        for name, p in pending.items():
            with reading(self.directory, name):
                out[name] = p if isinstance(p, np.ndarray) else np.asarray(p.result())
        return out


class reading:  # noqa: N801 - a context manager used like a function
    """Turns any error of Orbax or TensorStore while reading ``name`` into a
    :class:`CheckpointError` naming the checkpoint and the array."""

    def __init__(self, directory: str, name: str | None = None):
        self.directory, self.name = directory, name

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or isinstance(error, (CheckpointError, KeyboardInterrupt)):
            return False
        what = f"array {self.name!r}" if self.name else "its arrays"
        text = " ".join(str(error).split())
        if len(text) > 600:
            text = text[:600] + " ..."
        raise CheckpointError(f"{self.directory!r}: cannot read {what}: "
                              f"{type(error).__name__}: {text}") from error
