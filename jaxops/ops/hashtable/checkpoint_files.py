"""The file side of checkpoints: atomic replacement, the umask, and temporary files that a
killed writer left behind.

A save writes ``.<name>.<pid>.<random>.tmp`` next to ``<name>`` and renames it over the
target. A writer killed before the rename leaves that file; it is **stale** when the process
``<pid>`` no longer runs on this machine, or when it was last written more than
:data:`STALE_AFTER_S` seconds ago (a pid can be reused; a live writer keeps touching its
file). A later ``save`` or ``load`` of the same target removes its stale temporaries.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with atomic_writer("save", os.path.join(d, "t.bin")) as f:
...     _ = f.write(b"abc")
>>> os.listdir(d), is_stale(".t.bin.999999999.x1y2.tmp", "t.bin", 0.0)
(['t.bin'], True)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from typing import BinaryIO

from jaxops.core.errors import OpArgumentError, describe

__all__ = ["STALE_AFTER_S", "atomic_writer", "check_path", "is_stale", "remove_stale_temps"]

#: A temporary file untouched for this long is stale even if its pid runs (pid reuse).
STALE_AFTER_S = 3600.0


def _pid_running(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be writing it
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # another user's process
    except (ProcessLookupError, OverflowError, ValueError):
        return False  # no such process (or a number no pid can be)
    return True


def is_stale(name: str, target_name: str, mtime: float, now: float | None = None) -> bool:
    """Whether ``name`` (a file name in the target's directory) is a temporary of a save of
    ``target_name`` whose writer is gone (see the module docstring)."""
    prefix = f".{target_name}."
    if not (name.startswith(prefix) and name.endswith(".tmp")):
        return False
    parts = name[len(prefix):-len(".tmp")].split(".")
    if len(parts) > 2 or (len(parts) == 2 and not parts[0].isdigit()):
        return False  # another target's temporary (its name has more dots)
    now = time.time() if now is None else now
    if now - mtime > STALE_AFTER_S:
        return True
    return len(parts) == 2 and not _pid_running(int(parts[0]))


def check_path(op: str, path: object) -> str:
    """``path`` as a ``str`` if it is a file-system path (``str`` or ``os.PathLike``); else
    an :class:`~jaxops.errors.OpArgumentError` naming ``op``.

    >>> check_path("save", None)
    Traceback (most recent call last):
    ...
    jaxops.core.errors.OpArgumentError: save: argument 'path': expected a file path (str or os.PathLike), got NoneType.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OpArgumentError(op, "path", "a file path (str or os.PathLike)", type(path).__name__)
    path = os.fspath(path)
    if not isinstance(path, str):
        raise OpArgumentError(op, "path", "a file path (str or os.PathLike of str)",
                              type(path).__name__)
    return path


def remove_stale_temps(path: str | os.PathLike) -> list[str]:
    """Removes the stale temporaries of ``path``'s saves; returns the names removed."""
    path = os.path.abspath(os.fspath(path))
    directory, target = os.path.split(path)
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed  # no directory: nothing to clean (the caller reports the path)
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False) and \
                    is_stale(entry.name, target, entry.stat(follow_symlinks=False).st_mtime):
                os.unlink(entry.path)
                removed.append(entry.name)
        except OSError:
            pass  # gone meanwhile, or not ours to remove: a later call tries again
    return removed


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it (restored at once)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_writer(op: str, path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces ``path`` atomically when the block ends
    without an exception (flushed, fsync'ed, renamed, directory fsync'ed); on an exception
    the temporary is removed and ``path`` is untouched. The file gets mode ``0o666 & ~umask``.

    Raises:
        FileNotFoundError, PermissionError, IsADirectoryError: naming ``path`` (not the
            temporary) when its directory is missing or not writable, or it is a directory.
    """
    path = check_path(op, path)
    full = os.path.abspath(path)
    directory, target = os.path.split(full)
    if os.path.isdir(full):
        raise _path_error(IsADirectoryError(21, "Is a directory"), op, path, "It is a directory")
    remove_stale_temps(full)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target}.{os.getpid()}.", suffix=".tmp",
                                   dir=directory)
    except OSError as e:
        why = "Its directory does not exist" if isinstance(e, FileNotFoundError) else \
            "Its directory cannot be written to"
        raise _path_error(e, op, path, why) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, full)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _path_error(e: OSError, op: str, path: str, why: str) -> OSError:
    msg = describe(op, "path", "a file path in an existing directory this process can write",
                   repr(path), f"{why} ({e.strerror})")  # str(e) adds ": path"
    err = type(e)(e.errno, msg)
    err.filename = path
    return err
