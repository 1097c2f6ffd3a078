"""Sharded hash tables on 8 host devices (jaxops.hashtable.ShardedHashTable).

The checks live in ``tests/helpers/sharded_checks.py`` and run in ONE child process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must precede the child's
jax import; this process keeps its single device). At the same time two more processes
(``tests/helpers/sharded_multiprocess.py``, ``jax.distributed`` with gloo, 4 devices each) train
a table and its optimizer state with a jitted, donated step, save and restore them; the
8-device child's last checks restore those checkpoints in a fresh process (onto 4 shards
against one unsharded table, and resumed on 2 shards), so its reference programs are those
it compiled already. The
children compile with XLA's backend optimisation off: the checks compare results, not
speed, and compiling (which dominates their time) takes half as long.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

import tests.helpers.sharded_checks as checks

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = [fn.__name__ for fn in checks.CHECKS]
LAST = ("two_processes_match_one_table", "resumed_on_2_shards_in_a_fresh_process")


def _env(devices: int) -> dict:
    """The child's environment: this session's (its XLA flags and compilation cache, see
    conftest.py) plus ``devices`` forced host devices."""
    flags = [os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={devices}"]
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(flags).strip())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(out) -> tuple[list, list]:
    """Starts the 2-process run into ``out``; returns the processes and their log files."""
    port = str(_free_port())
    logs = [open(out / f"process-{i}.log", "w+") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "sharded_multiprocess.py"),
                               str(i), port, str(out)], env=_env(4), stdout=log,
                              stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
    return procs, logs


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    procs, logs = _two_processes(out)
    with open(out / "checks.err", "w+") as err:
        child = subprocess.Popen([sys.executable, os.path.join(HERE, "sharded_checks.py")],
                                 env=_env(8), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=err, text=True)
        try:
            codes = [p.wait(timeout=600) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        status = f"ok {out}" if codes == [0, 0] else f"failed (exit codes {codes})"
        stdout = child.communicate(input=status + "\n", timeout=900)[0]
        err.seek(0)
        stderr = err.read()
    found = {"_processes": []}
    for log in logs:
        log.seek(0)
        found["_processes"].append(log.read()[-3000:])
        log.close()
    for line in stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            found[row["check"]] = row
    if len(found) == 1:
        pytest.fail(f"the 8-device child printed no results (rc {child.returncode}):\n"
                    f"{stderr[-4000:]}")
    return found


@pytest.mark.parametrize("name", NAMES)
def test_sharded_check(results, name):
    row = results.get(name)
    assert row is not None, f"{name} did not report (the child stopped early?)"
    extra = ("\n----\n".join(results["_processes"])
             if name in LAST else "")
    assert row["ok"], row["error"] + extra


def test_step_sets_every_shard_clock_and_donate_consumes_the_table():
    import jax
    import numpy as np

    import jaxops.hashtable as ht
    from jaxops.core.errors import OpArgumentError

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    t = ht.init_sharded_table(16, 2, mesh, "d", initializer_mode="constant")
    t, _, info = ht.lookup_or_insert(t, np.array([3, 4], np.int64), step=7)
    slots = np.asarray(info.slots)
    assert np.asarray(t.shards.clock).tolist() == [7]
    assert np.asarray(t.shards.last_access).reshape(-1)[slots].tolist() == [7, 7]
    new, _, info = ht.lookup_or_insert(t, np.array([3], np.int64), donate=True)
    assert t.shards.values.is_deleted() and int(info.inserted) == 0 and int(new.live) == 2
    with pytest.raises(OpArgumentError, match="donate"):  # a rerun would need the table
        ht.lookup_or_insert(new, np.array([3], np.int64), donate=True, route_capacity=1)
    with pytest.raises(OpArgumentError, match="step"):
        ht.lookup_or_insert(t, np.array([3], np.int64), step=2**32)
