"""SIGKILLs during asynchronous saves: each new process restores the last step exactly.

A process saves a train state (a table with its Adagrad state and a 2 MiB array) step after
step through an Orbax ``CheckpointManager`` (asynchronous saves, ``max_to_keep=2``,
``cleanup_tmp_directories``) and is killed with SIGKILL at a random moment after a save
began. The next process restores the latest step, checks it bit for bit against the state
that step saved, saves on, and is killed in turn (the child is
``tests/helpers/checkpoint_fresh.py kill``). A round is bad when the restore fails or
differs, when the latest step goes back, or (from the third process on) when there is no
step to restore; temporary directories must never pile up (at most the one being written
and one being cleaned).

The table's ``ms`` columns show counts / 1000 (``columns read counts``): ours is the bad
rounds, the peer the rounds; the target is 0. ``JAXOPS_BENCH_KILLS`` kills (default 20;
5 with ``--quick``). The suite runs the same trial with 2 kills
(``tests/hashtable/checkpoint/test_fresh_process.py``).

Run ``python -m benchmarks --only checkpoint_kills``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.common import Result

__all__ = ["run", "sigkill_trial"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(ROOT, "tests", "helpers", "checkpoint_fresh.py")
MOST_TEMPORARIES = 2  # the one being written, and one being cleaned


def _child(where: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, CHILD, "kill", where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))


def sigkill_trial(where: str, kills: int, seed: int = 0) -> dict:
    """``kills`` SIGKILLs of processes saving into ``where/kill`` (the last process is
    stopped after its restore): ``{"verified": [latest step each process restored, None
    for none], "temporaries": [temporaries after each kill], "failure": None or what went
    wrong (a restore that crashed or differed, with the child's stderr)}``."""
    rng = random.Random(seed)
    out = {"verified": [], "temporaries": [], "failure": None}
    for round_ in range(kills + 1):
        child = _child(where)
        first = json.loads(child.stdout.readline() or '{"crash": "no output"}')
        if "crash" in first or first.get("differ"):
            child.kill()
            child.wait()
            out["failure"] = f"round {round_}: {first} {child.stderr.read()[-3000:]}"
            return out
        out["verified"].append(first["verified"])
        if round_ == kills:
            child.kill()
            child.wait()
            break
        json.loads(child.stdout.readline())  # a save has begun
        time.sleep(rng.uniform(0.0, 0.6))
        child.send_signal(signal.SIGKILL)
        child.wait()
        out["temporaries"].append(
            sum("tmp" in n for n in os.listdir(os.path.join(where, "kill"))))
    return out


def bad_rounds(trial: dict) -> dict[str, int]:
    """The rounds that went wrong, by what: ``restore`` (a crash or a difference: the trial
    stopped there), ``order`` (the latest step went back, or from the third process on
    there was none), ``temporaries`` (more than :data:`MOST_TEMPORARIES` left)."""
    verified = trial["verified"]
    order = sum(v is None for v in verified[2:]) + sum(
        (a or 0) > (b or 0) for a, b in zip(verified, verified[1:]))
    return {"restore": int(trial["failure"] is not None),
            "order": order + (verified[:1] != [None]),
            "temporaries": sum(n > MOST_TEMPORARIES for n in trial["temporaries"])}


def run(quick: bool) -> list[Result]:
    kills = int(os.environ.get("JAXOPS_BENCH_KILLS") or (5 if quick else 20))
    where = tempfile.mkdtemp(prefix="jaxops-kills-")
    try:
        start = time.perf_counter()
        trial = sigkill_trial(where, kills)
        took = time.perf_counter() - start
    finally:
        shutil.rmtree(where, ignore_errors=True)
    bad = bad_rounds(trial)
    print(f"  {kills} kills in {took:.0f} s: restored steps {trial['verified']}, "
          f"temporaries {trial['temporaries']}", flush=True)
    if trial["failure"]:
        print(f"    BAD {trial['failure']}", flush=True)
    note = "columns read counts; rounds of save, SIGKILL, restore in a new process"
    rows = (("restore", "restore failed or differed"), ("order", "latest step went back or none"),
            ("temporaries", f"more than {MOST_TEMPORARIES} temporaries"))
    return [Result(f"sigkill saves: {what}", bad[key] / 1000, "rounds", (kills + 1) / 1000, 0.0,
                   note=note) for key, what in rows]
