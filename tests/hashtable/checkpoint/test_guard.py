"""Saves under an adversary (issue 30): concurrent saves take turns and the last completed
checkpoint survives, a save touches only files it owns, a failed save leaves nothing behind
and names its path, and a restore refuses what is not a checkpoint.

The long form (20 rounds of concurrent saves from processes) is
``benchmarks/checkpoint_adversary.py``.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

import jaxops.hashtable as ht
from jaxops.errors import CheckpointError
from jaxops.hashtable.checkpoint import _guard as checkpoint_guard
from jaxops.hashtable.checkpoint import _handler as checkpoint_handler
from tests.helpers.util import ROOT


def _table(n: int):
    """A table holding keys ``0..n-1``: its live count names the save it came from. (The
    batch is always 9 keys, ``0..n-1`` repeated: one program for every ``n``.)"""
    t = ht.init_table(64, 2, initializer_mode="constant")
    t, _, _ = ht.lookup_or_insert(t, np.arange(9, dtype=np.int64) % n)
    return t


def _leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if "tmp" in n or "jaxops-" in n)


def test_force_replaces_only_a_checkpoint(tmp_path):
    user = tmp_path / "g-drive-backup"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    for target in (user, tmp_path / "a-file"):
        if target.name == "a-file":
            target.write_text("mine")
        with pytest.raises(CheckpointError, match="refusing to replace it"):
            ht.save(_table(1), target, force=True)
    assert (user / "notes.txt").read_text() == "mine" and (tmp_path / "a-file").exists()
    (user / "notes.txt").unlink()
    (user / "jaxops.json").write_text("{}")  # looks like one, but jaxops did not sign it
    with pytest.raises(CheckpointError, match="not a jaxops checkpoint"):
        ht.save(_table(2), user, force=True)
    (user / "jaxops.json").unlink()
    ht.save(_table(2), user, force=True)  # empty: now a checkpoint, whatever else it holds
    (user / "any-file-a-new-orbax-writes").write_text("")
    ht.save(_table(4), user, force=True)  # replaced whole
    assert int(ht.load(user).live) == 4 and "any-file-a-new-orbax-writes" not in os.listdir(user)
    empty = tmp_path / "empty"  # as tempfile.mkdtemp() makes: nothing to lose
    empty.mkdir()
    with pytest.raises(CheckpointError, match="exists: pass force=True"):
        ht.save(_table(1), empty)
    ht.save(_table(3), empty, force=True)
    assert int(ht.load(empty).live) == 3 and _leftovers(tmp_path) == []


def test_an_existing_checkpoint_is_refused_then_replaced_whole(tmp_path):
    ht.save(_table(1), tmp_path / "c")
    with pytest.raises(CheckpointError, match="exists: pass force=True"):
        ht.save(_table(2), tmp_path / "c")
    ht.save(_table(3), tmp_path / "c", force=True)
    assert int(ht.load(tmp_path / "c").live) == 3 and _leftovers(tmp_path) == []


def test_a_manager_keeps_the_users_files(tmp_path):
    """Retention deletes old steps, never the user's ``g-*`` or other files."""
    (tmp_path / "g-drive-backup").mkdir()
    (tmp_path / "g-drive-backup" / "notes.txt").write_text("mine")
    (tmp_path / "README").write_text("mine")
    with ocp.CheckpointManager(tmp_path, options=ocp.CheckpointManagerOptions(
            max_to_keep=1)) as mngr:
        for step in range(3):
            mngr.save(step, args=ht.checkpoint.Save({"t": _table(step + 1)}))
        mngr.wait_until_finished()
    assert sorted(os.listdir(tmp_path)) == ["2", "README", "g-drive-backup"]
    assert (tmp_path / "g-drive-backup" / "notes.txt").read_text() == "mine"


def test_saves_from_threads_take_turns(tmp_path):
    """Eight threads save to one path at once: one creates it, the others find it (without
    force) or replace it whole (with force); it always loads as one of them, exactly."""
    path = tmp_path / "c"
    outcomes = []

    def save(n: int, force: bool):
        try:
            ht.save(_table(n), path, force=force)
            outcomes.append(("saved", n))
        except CheckpointError:
            outcomes.append(("refused", n))

    for force in (False, True):
        threads = [threading.Thread(target=save, args=(n, force)) for n in range(1, 9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        saved = [n for what, n in outcomes if what == "saved"]
        if not force:
            assert len(saved) == 1 and len(outcomes) == 8, outcomes
            assert int(ht.load(path).live) == saved[0]
        else:
            assert len(saved) == 1 + 8, outcomes  # every forced save completed, in turn
            assert int(ht.load(path).live) in saved[1:]
        assert _leftovers(tmp_path) == []


_SAVER = textwrap.dedent("""
    import resource, signal, sys, numpy as np
    sys.path.insert(0, {root!r})
    import jax.numpy as jnp
    import jaxops.hashtable as ht
    n, turns, then = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    t = ht.init_table(64, 2, initializer_mode="constant")
    t, _, _ = ht.lookup_or_insert(t, np.arange(n, dtype=np.int64))
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(3):
        ht.save(t, turns, force=True)
    print("done", flush=True)
    what = sys.stdin.readline().strip()
    if what == "fsize":  # a real write failure: RLIMIT_FSIZE, EFBIG from TensorStore
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        big = ht.init_table(1 << 15, 16, initializer_mode="constant")
        resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))
        try:
            ht.save(big, then)
        except OSError as e:
            print("OSError", e.errno, e.filename, flush=True)
    elif what == "kill":  # a forced save the test kills midway
        state = {{"t": ht.init_table(1 << 16, 64, initializer_mode="constant"),
                  "w": jnp.ones((2048, 4096))}}
        print("saving", flush=True)
        ht.save(state, then, force=True)
""")


@pytest.fixture(scope="module")
def savers(tmp_path_factory):
    """Two saver processes and this one (three processes) save to one path at once, three
    times each; then one of them saves under a file size limit, and the other is killed
    while a forced save replaces a checkpoint. (Two child processes for the three tests:
    each new process imports jax, the tests' main cost.)"""
    script, turns, fsize, kill = (tmp_path_factory.mktemp(n) for n in
                                  ("script", "turns", "fsize", "kill"))
    (script / "saver.py").write_text(_SAVER.format(root=ROOT))
    ht.save(_table(9), turns / "c")
    ht.save(_table(6), kill / "c")
    procs = [subprocess.Popen([sys.executable, str(script / "saver.py"), str(n), str(turns / "c"),
                               str(then)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
             for n, then in ((1, fsize / "big"), (2, kill / "c"))]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for _ in range(3):  # the third process: this one
            ht.save(_table(3), turns / "c", force=True)
        done = [p.stdout.readline().strip() for p in procs]
        out = {"turns": (done, int(ht.load(turns / "c").live), _leftovers(turns))}
        procs[0].stdin.write("fsize\n")
        procs[0].stdin.flush()
        out["fsize"] = (procs[0].communicate(timeout=300)[0].split(), procs[0].returncode,
                        os.listdir(fsize), str(fsize / "big"))
        child = procs[1]
        child.stdin.write("kill\n")
        child.stdin.flush()
        out["saving"] = child.stdout.readline().strip()
        deadline = time.monotonic() + 120
        while not any("tmp" in n or "replacing" in n for n in os.listdir(kill)) and \
                child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out, kill


def test_saves_from_processes_take_turns(savers):
    """Three processes save to one path, three times each, released together: every save
    completes in turn and the path holds a whole checkpoint of one of them."""
    done, live, leftovers = savers[0]["turns"]
    assert done == ["done", "done"] and live in (1, 2, 3) and leftovers == []


def test_a_file_size_limit_fails_the_save_cleanly(savers):
    """A real write failure (RLIMIT_FSIZE: EFBIG from TensorStore) in a child process."""
    out, code, left, big = savers[0]["fsize"]
    assert out == ["OSError", "27", big] and code == 0 and left == [], out


def test_a_forced_save_killed_midway_leaves_a_whole_checkpoint(savers):
    """SIGKILL while the replacement is written beside the old one, or swapped in: the
    path holds a whole checkpoint, the old or the new; the next forced save clears what the
    killed one left."""
    import jax
    import jax.numpy as jnp

    from jaxops.hashtable.checkpoint._meta import read_meta

    def big():
        return {"t": ht.init_table(1 << 16, 64, initializer_mode="constant"),
                "w": jnp.ones((2048, 4096))}

    out, where = savers
    assert out["saving"] == "saving"
    if "~root" in read_meta(where / "c")["tables"]:
        assert int(ht.load(where / "c").live) == 6  # the old one
    else:
        back = ht.load(where / "c", jax.eval_shape(big))  # the new one, whole
        assert float(back["w"][0, 0]) == 1.0
    ht.save(_table(7), where / "c", force=True)
    assert int(ht.load(where / "c").live) == 7 and _leftovers(where) == []


def test_a_failed_save_leaves_nothing_and_names_its_path(tmp_path, monkeypatch):
    """A write refused by the file system (here: jaxops.json's, at commit) fails the save
    with an OSError naming the checkpoint; its temporary directory is removed, and a
    forced save that fails leaves the previous checkpoint in place."""
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    ht.save(_table(4), tmp_path / "c")
    monkeypatch.setattr(checkpoint_handler, "write_meta", full)
    for path, force in ((tmp_path / "new", False), (tmp_path / "c", True)):
        with pytest.raises(OSError, match="No space left on device") as err:
            ht.save(_table(5), path, force=force)
        assert err.value.filename == str(path) and str(path) in str(err.value)
        assert _leftovers(tmp_path) == [] and not (tmp_path / "new").exists()
    monkeypatch.undo()
    assert int(ht.load(tmp_path / "c").live) == 4


@pytest.mark.parametrize("kind", ["fifo", "file", "missing"])
def test_a_restore_refuses_what_is_not_a_checkpoint_directory(tmp_path, kind):
    path = tmp_path / "x"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "file":
        path.write_text("{}")
    with pytest.raises(CheckpointError, match="not a directory"):
        ht.load(path)


def test_a_checkpoint_holding_a_fifo_is_refused_without_blocking(tmp_path):
    ht.save(_table(2), tmp_path / "c")
    os.mkfifo(tmp_path / "c" / "d" / "stuck")
    with pytest.raises(CheckpointError, match="not a regular file or directory"):
        ht.load(tmp_path / "c")
    (tmp_path / "c" / "jaxops.json").unlink()
    os.mkfifo(tmp_path / "c" / "jaxops.json")
    with pytest.raises(CheckpointError, match="not a regular file"):
        ht.load(tmp_path / "c")


def test_naming_path_keeps_other_errors():
    e = ValueError("not a file-system failure")
    assert checkpoint_guard.naming_path(e, "/c") is e
