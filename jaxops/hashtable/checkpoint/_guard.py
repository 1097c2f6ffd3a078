"""What a save may do to the file system: take its turn, touch only what it owns, leave
nothing behind when it fails.

- **One save at a time per directory.** A save by
  :class:`~jaxops.hashtable.checkpoint._handler.Checkpointer` (and so
  :func:`~jaxops.hashtable.checkpoint._save_load.save`) holds an exclusive ``flock`` on the
  directory it writes into, from before it looks at its destination until its checkpoint is
  committed: saves from other threads and processes into that directory wait their turn, so two
  saves to one path never write into one temporary directory (Orbax's is ``<path>`` plus a fixed
  suffix) and the second finds the first's checkpoint in place (refused without ``force``,
  replaced whole with it). In a multi-process run only the primary process takes it (the
  others write where it says). No lock file is created: the lock is on the directory.
- **Only its own files.** A save refuses an existing destination unless ``force=True``, and
  ``force`` replaces only a checkpoint or an empty directory. A checkpoint is known by the
  file jaxops itself writes into it, in the same atomic commit: a ``jaxops.json`` whose
  SHA-256 matches its body (:func:`~jaxops.hashtable.checkpoint._meta.is_checkpoint`), never
  by the names of Orbax's own files, which a new Orbax may change. Anything else (a user's
  directory, a file, a damaged checkpoint) is refused.
- **The last checkpoint survives.** ``force`` writes the new checkpoint beside the old
  (``<path>.jaxops-replacing``) and, once it is committed, the primary process exchanges
  the two atomically and deletes the old: a save killed or failing at any moment leaves
  the previous checkpoint at ``path`` (Orbax's own ``force`` deletes it first).
- **Nothing left behind.** A save that fails removes its temporary directory, and its error
  names the checkpoint's path (a full disk, a file-size limit).

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> os.mkdir(os.path.join(d, "notes")); open(os.path.join(d, "notes", "a.txt"), "w").close()
>>> check_destination(os.path.join(d, "notes"), force=True)
Traceback (most recent call last):
...
jaxops.core.errors.CheckpointError: save: ... is not a jaxops checkpoint (it holds no jaxops.json that jaxops signed): refusing to replace it (force=True replaces only a checkpoint or an empty directory)
"""

from __future__ import annotations

import os
import re
import shutil
import stat

from jaxops.core.errors import CheckpointError
from jaxops.hashtable.checkpoint._meta import is_checkpoint

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: saves do not take turns
    fcntl = None

__all__ = ["STAGING_SUFFIX", "DirectoryTurn", "check_destination", "naming_path",
           "remove_temporary", "swap_into_place"]

_REFUSED = "refusing to replace it (force=True replaces only a checkpoint or an empty directory)"


class DirectoryTurn:
    """An exclusive ``flock`` on ``directory`` (blocking until this save's turn), released
    by :meth:`release`. Threads each open the directory, so they take turns as processes
    do.

    >>> import tempfile
    >>> turn = DirectoryTurn(tempfile.mkdtemp())
    >>> turn.release(); turn.release()  # idempotent
    """

    def __init__(self, directory: str):
        self._fd = None
        if fcntl is None:
            return
        self._fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self._fd)
            raise

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def check_destination(path: str, force: bool) -> None:
    """Refuses ``path`` unless it is free, or ``force`` and it is a checkpoint or an empty
    directory (``tempfile.mkdtemp()``: nothing of anyone's is deleted).

    Raises:
        CheckpointError: ``path`` exists (without ``force``), or is not a checkpoint (a
            file, a link, or a directory without a jaxops.json that jaxops signed).
    """
    if not os.path.lexists(path):
        return
    if not force:
        raise CheckpointError(f"save: {path!r} exists: pass force=True to replace it, or save "
                              "each step to its own directory (CheckpointManager)")
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        raise CheckpointError(f"save: {path!r} is not a directory (a file or a link): "
                              + _REFUSED)
    if os.listdir(path) and not is_checkpoint(path):
        raise CheckpointError(f"save: {path!r} is not a jaxops checkpoint (it holds no "
                              "jaxops.json that jaxops signed): " + _REFUSED)


#: Where ``force=True`` writes the replacement before it takes the old checkpoint's place.
STAGING_SUFFIX = ".jaxops-replacing"
_RENAME_EXCHANGE = 2  # renameat2's flag (Linux 3.15+)


def swap_into_place(staged: str, path: str) -> None:
    """Puts the committed checkpoint ``staged`` at ``path`` and deletes the one it replaces:
    an atomic exchange where the kernel offers one (``renameat2``), so ``path`` holds a
    whole checkpoint at every moment; else two renames (the old one is kept as
    ``<path>.jaxops-old`` until the new one is in place)."""
    if not _exchange(staged, path):
        old = path + ".jaxops-old"
        remove_temporary(old)
        os.rename(path, old)
        os.rename(staged, path)
        staged = old
    remove_temporary(staged)  # now the replaced checkpoint


def _exchange(a: str, b: str) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # not glibc 2.28+
        return False
    at_cwd = -100  # False: e.g. a file system without exchange (the caller falls back)
    return renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0


def remove_temporary(temporary: str) -> None:
    """Removes a failed save's temporary directory (its own: taken under its turn)."""
    if os.path.lexists(temporary):
        if os.path.isdir(temporary) and not os.path.islink(temporary):
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            os.unlink(temporary)


def naming_path(error: BaseException, path: str) -> BaseException:
    """``error`` as an :class:`OSError` naming the checkpoint's ``path`` when it is a
    file-system failure (an ``OSError``, or TensorStore's error carrying an OS error code);
    else ``error`` itself.

    >>> e = naming_path(ValueError("Failed writing: x [os_error_code='28']"), "/ck")
    >>> type(e).__name__, e.errno, e.filename
    ('OSError', 28, '/ck')
    """
    if isinstance(error, OSError):
        code = error.errno
    else:
        found = re.search(r"os_error_code='?(\d+)", str(error))
        if not found:
            return error
        code = int(found.group(1))
    reason = os.strerror(code) if code else str(error)
    return OSError(code, f"saving the checkpoint {path!r} failed: {reason} ({error})", path)
