"""Sharded hash tables on 8 host devices (jaxops.hashtable.ShardedHashTable).

The checks live in ``tests/sharded_checks.py`` and run in ONE child process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must precede the child's
jax import; this process keeps its single device). The child compiles with XLA's backend
optimisation off: the checks compare results, not speed, and compiling the ~30 programs
(single and sharded) takes half the time then.
"""

import json
import os
import subprocess
import sys

import pytest

import tests.sharded_checks as checks

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = [fn.__name__ for fn in checks.CHECKS]


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join([
        "--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true"]))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "sharded_checks.py")], env=env,
                          capture_output=True, text=True, timeout=900)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            found[row["check"]] = row
    if not found:
        pytest.fail(f"the 8-device child printed no results (rc {proc.returncode}):\n"
                    f"{proc.stderr[-4000:]}")
    return found


@pytest.mark.parametrize("name", NAMES)
def test_sharded_check(results, name):
    row = results.get(name)
    assert row is not None, f"{name} did not report (the child stopped early?)"
    assert row["ok"], row["error"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_table(tmp_path):
    """2 processes x 2 host devices (jax.distributed, gloo) train, save; this process loads
    the checkpoint onto its one device and compares it with one unsharded table."""
    import jax
    import numpy as np

    import jaxops.hashtable as ht
    import tests.sharded_multiprocess as mp

    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join([
        "--xla_force_host_platform_device_count=2", "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true"]))
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "sharded_multiprocess.py"),
                               str(i), str(port), str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n----\n".join(o[-3000:] for o in outs)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("shard",))
    loaded = ht.load(str(tmp_path / "table"), mesh=mesh, axis="shard")
    assert loaded.num_shards == 1 and loaded.bucket_size == 256
    single = ht.init_table(1024, mp.DIM, initializer_mode="constant", constant_value=0.5)
    single, _, _ = mp.train(single, ht.adam_w_init(single), ht)
    checks.same(checks.entries(single, live_only=True), checks.entries(loaded, live_only=True),
                "2 processes vs one table", exact_rows=False)
    assert int(loaded.live) == int(single.live) > 0


def test_step_sets_every_shard_clock_and_donate_is_refused_by_name():
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
    with pytest.raises(OpArgumentError, match="donate"):
        ht.lookup_or_insert(t, np.array([3], np.int64), donate=True)
    with pytest.raises(OpArgumentError, match="step"):
        ht.lookup_or_insert(t, np.array([3], np.int64), step=2**32)
