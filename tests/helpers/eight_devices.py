"""The 8-device child: every 8-device check of a test run, in one process, one result each.

``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set before jax is imported
(so the rest of the suite keeps its one device), so the 8-device checks run in a child,
``python tests/helpers/eight_devices.py OUT CHECK...``: the placement matrix's rows on 8
shards (``matrix.<row>``, ``tests/helpers/placement_matrix.py``) and the checks of
``tests/helpers/sharded_checks.py`` (the 2-process run starts first, beside them). Each
check writes ``OUT/<check>.json`` (``{"check", "ok", "error", "seconds", "cpu"}``) when it ends;
``OUT/done.json`` holds the child's exit, wall and CPU seconds (its 2 processes included).

A test run starts the child once, in the background, as soon as collection has found its
8-device tests (marked ``@pytest.mark.eight_devices(CHECK)``; ``tests/conftest.py``), from
whichever xdist worker gets there first, and the tests run last: each reads its own check's
file (:func:`outcome`), so a failure names its check and nothing of the child's setup is
charged to one check. The child's time is shown in the run's summary (:func:`summary`):
its wall and CPU seconds and each check's own seconds.

Run it by hand to debug a check:
``python tests/helpers/eight_devices.py /tmp/out matrix.evict routing_overflow_is_reported``.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback

RUN_DIR = "JAXOPS_TEST_EIGHT_DEVICES"  # the test run's directory for the child's results
MARK = "eight_devices"
_STARTED: list[subprocess.Popen] = []  # the child, in the process that started it


def env(devices: int = 8) -> dict:
    """The child's environment: this process's (its XLA flags and compilation cache, see
    conftest.py) plus ``devices`` forced host devices."""
    flags = [os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={devices}"]
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(flags).strip())


def start(checks: list[str]) -> None:
    """Starts the child for ``checks`` unless a process of this test run has (the first to
    make ``started`` in the run's directory starts it)."""
    out = os.environ[RUN_DIR]
    try:
        os.mkdir(os.path.join(out, "started"))
    except FileExistsError:
        return
    with open(os.path.join(out, "child.log"), "w") as log:
        _STARTED.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), out,
                                          *checks], env=env(), stdout=log,
                                         stderr=subprocess.STDOUT))
    with open(os.path.join(out, "child.pid"), "w") as f:
        f.write(str(_STARTED[0].pid))


def finish(timeout: float = 900) -> None:
    """Waits for the child this process started, if any (its CPU time then counts in this
    process's children)."""
    for proc in _STARTED:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def outcome(check: str, timeout: float = 900) -> dict:
    """The result of ``check``, once the child has written it; raises AssertionError (with
    the child's log) when the child ended without it."""
    out = os.environ[RUN_DIR]
    path, done = os.path.join(out, f"{check}.json"), os.path.join(out, "done.json")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if os.path.exists(done) or time.monotonic() > deadline:
            log = open(os.path.join(out, "child.log")).read()[-4000:] \
                if os.path.exists(os.path.join(out, "child.log")) else "(no log)"
            raise AssertionError(f"the 8-device child ended without a result for {check} "
                                 f"(or took over {timeout:.0f} s):\n{log}")
        time.sleep(0.2)
    with open(path) as f:
        return json.load(f)


def assert_passed(check: str) -> None:
    """Raises AssertionError, with the check's traceback from the child, unless ``check``
    passed there."""
    row = outcome(check)
    if not row["ok"]:
        raise AssertionError(f"{check} failed in the 8-device child "
                             f"({row['seconds']:.1f} s):\n{row['error']}")


def stop(out: str) -> None:
    """Kills the child of the run whose directory is ``out`` if it is still running (the
    run was interrupted): the process the run started, by its id, checked first."""
    try:
        with open(os.path.join(out, "child.pid")) as f:
            pid = int(f.read())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, ValueError):
        return  # never started, or ended
    ours = os.path.basename(__file__).encode() in cmdline and out.encode() in cmdline
    if ours and not os.path.exists(os.path.join(out, "done.json")):
        os.kill(pid, signal.SIGKILL)


def summary(out: str) -> list[str]:
    """Lines for the run's summary: the child's time and each check's."""
    done = os.path.join(out, "done.json")
    if not os.path.exists(done):
        return []
    with open(done) as f:
        d = json.load(f)
    rows = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".json") and name != "done.json":
            with open(os.path.join(out, name)) as f:
                rows.append(json.load(f))
    rows.sort(key=lambda r: -r["seconds"])
    failed = [r["check"] for r in rows if not r["ok"]]
    return [f"8-device checks: {len(rows)} in one child process, started at collection beside "
            f"the tests: {d['wall']:.1f} s wall, {d['cpu']:.1f} s CPU (its 2-process run "
            f"included); each check's test reads its result",
            "  slowest: " + ", ".join(f"{r['check']} {r['seconds']:.1f} s" for r in rows[:8]),
            f"  failed in the child (see their tests): {', '.join(failed) or 'none'}"]


def _cpu() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def _write(out: str, name: str, row: dict) -> None:
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(row, f)
    os.replace(tmp, os.path.join(out, name))  # whole, or not there


#: The cyclic GC thresholds of the test processes and of this child (set by conftest.py and
#: by :func:`main`): a young-generation pass every 700 allocations is ~10 % of the CPU.
GC_THRESHOLDS = (50_000, 20, 20)


def main(out: str, names: list[str]) -> int:
    start_time = time.perf_counter()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    from tests.helpers import placement_matrix as matrix
    from tests.helpers import sharded_checks

    checks = {f"matrix.{r.id}": (lambda r=r: matrix.run_row(r, matrix.EIGHT))
              for r in matrix.ROWS}
    checks.update((fn.__name__, fn) for fn in sharded_checks.CHECKS)
    names = names or list(checks)
    run = sharded_checks.two_processes_train_save_and_resume.__name__
    needs = [i for i, n in enumerate(names) if n in sharded_checks.ON_TWO_PROCESSES]
    if needs and run not in names[:needs[0]]:  # the run's own check before those reading it
        names = [n for n in names if n != run]
        names.insert(needs[0], run)
    if run in names:  # the 2-process run starts now, beside the other checks
        os.makedirs(os.path.join(out, "two-processes"), exist_ok=True)
        sharded_checks.start_two_processes(os.path.join(out, "two-processes"), dict(os.environ))
    import jax

    failed = 0
    for name in names:
        begin, cpu = time.perf_counter(), _cpu()
        try:
            assert len(jax.devices()) >= 8, "run with 8 forced host devices (eight_devices.env)"
            if name not in checks:
                raise AssertionError(f"no 8-device check named {name!r}")
            checks[name]()
            row = {"check": name, "ok": True, "error": ""}
        except Exception:  # noqa: BLE001 - reported to the check's test
            row = {"check": name, "ok": False, "error": traceback.format_exc()}
            failed += 1
        row["seconds"] = round(time.perf_counter() - begin, 2)
        row["cpu"] = round(_cpu() - cpu, 2)
        _write(out, f"{name}.json", row)
    _write(out, "done.json", {"rc": int(failed > 0), "cpu": round(_cpu(), 1),
                              "wall": round(time.perf_counter() - start_time, 1)})
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
