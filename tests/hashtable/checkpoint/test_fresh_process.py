"""Checkpoints restored in a fresh process (``tests/helpers/checkpoint_fresh.py``): an exact
resume on one device, every corruption of every file refused (or harmless), and SIGKILLs
during asynchronous saves.

This process saves; a child that never saw the checkpoints restores them (in the saving
process TensorStore's cache can hide a flipped byte).
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

import jaxops.hashtable as ht
import tests.helpers.checkpoint_fresh as fresh
from benchmarks.checkpoint_adversary import counterpart
from benchmarks.checkpoint_kills import sigkill_trial

KILLS = 2  # the full trial is benchmarks/checkpoint_kills.py


def _child(mode: str, where, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, fresh.__file__, mode, str(where)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"), **kwargs)


def _lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root)
                  for f in fs)


def _damaged_copies(intact, other, cases) -> dict[str, str]:
    """Copies of ``intact`` with one file damaged each: bytes flipped at spread places,
    truncated, or swapped in from ``other`` (the same run, another step)."""
    made = {}
    for i, rel in enumerate(_files(intact)):
        data = (intact / rel).read_bytes()
        spread = range(0, len(data), max(1, len(data) // 24)) if rel.startswith("d/") else \
            (0, len(data) // 3, 2 * len(data) // 3)  # the arrays' bytes: many places
        damages = {f"flip{k}": lambda d, at=at: d[:at] + bytes([d[at] ^ 0x10]) + d[at + 1:]
                   for k, at in enumerate(sorted({*spread, len(data) - 1})) if data}
        damages["half"] = lambda d: d[:len(d) // 2]
        swap = counterpart(str(other), rel, len(data))
        if swap is not None and open(swap, "rb").read() != data:
            damages["swap"] = lambda d, swap=swap: open(swap, "rb").read()
        for kind, damage in damages.items():
            name = f"{i:03d}-{kind}"
            shutil.copytree(intact, cases / name)
            (cases / name / rel).write_bytes(damage(data))
            made[name] = rel
    return made


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run of :data:`fresh.STEPS` steps saved at every step, its final state, damaged
    copies of step MID, and the child's verdicts on resume and on every copy."""
    where = tmp_path_factory.mktemp("fresh")
    state = fresh.fresh_state()
    with ocp.CheckpointManager(where / "run") as mngr:
        while state["step"] < fresh.STEPS:
            state = fresh.train_step(state)
            mngr.save(state["step"], args=ht.checkpoint.Save(state))  # asynchronous
        mngr.wait_until_finished()
    np.savez(where / "expected.npz", **fresh.flat(state))
    shutil.copytree(where / "run" / str(fresh.MID) / "default", where / "intact")
    (where / "cases").mkdir()
    made = _damaged_copies(where / "intact", where / "run" / str(fresh.STEPS) / "default",
                           where / "cases")
    resume = _child("resume", where)
    corrupt = _child("corrupt", where)
    out = {mode: proc.communicate(timeout=600) for mode, proc in (("resume", resume),
                                                                   ("corrupt", corrupt))}
    return where, made, {mode: _lines(o) or [{"crash": e[-3000:]}] for mode, (o, e) in out.items()}


def test_a_resume_in_a_fresh_process_is_bit_identical(run):
    (row,) = run[2]["resume"]
    assert row == {"check": "resume", "differ": []}, row


def test_every_damaged_file_is_refused_or_harmless(run):
    """Every file of a checkpoint (arrays, Orbax's metadata and manifests, jaxops.json),
    each damaged alone: restoring it raises CheckpointError or gives the intact state bit
    for bit, never a different state or another error. A data file (and jaxops.json) the
    restore reads is refused whatever its damage; the per-process files that Orbax's merge
    left behind are not read at all (every damage of one is harmless)."""
    _, made, rows = run
    outcomes = {row["case"]: row for row in rows["corrupt"] if "case" in row}
    assert set(outcomes) == set(made), rows["corrupt"][-1:]
    bad = {name: (made[name], row["outcome"], row["why"]) for name, row in outcomes.items()
           if row["outcome"] in ("wrong", "other")}
    assert not bad, bad
    per_file: dict[str, set] = {}
    for name, rel in made.items():
        per_file.setdefault(rel, set()).add(outcomes[name]["outcome"])
    data = {rel: seen for rel, seen in per_file.items()
            if rel.startswith(("d/", "ocdbt.process_0/d/")) or rel == "jaxops.json"}
    assert all(len(seen) == 1 for seen in data.values()), data
    assert {"d/", "jaxops.json"} <= {rel[:2] if rel.startswith("d/") else rel
                                     for rel, seen in data.items() if seen == {"refused"}}, data


def test_sigkill_during_asynchronous_saves_leaves_the_previous_step(tmp_path):
    """2 SIGKILLs at random moments of a run saving asynchronously: each new process
    restores the latest step and finds it exact; temporary directories never pile up.
    (The full trial, 20 kills, is the benchmark ``benchmarks/checkpoint_kills.py``.)"""
    trial = sigkill_trial(str(tmp_path), KILLS)
    assert trial["failure"] is None, trial["failure"]
    verified = trial["verified"]
    assert verified[0] is None and all(v is not None for v in verified[2:]), verified
    assert verified == sorted(verified, key=lambda v: v or 0), verified
    assert max(trial["temporaries"]) <= 2, trial  # the one being written (and one cleaning)
