"""Checkpoints restored in a fresh process (``tests/helpers/checkpoint_fresh.py``): an exact
resume on one device, every corruption of every file refused (or harmless), the sharded
corruption fuzz of ``benchmarks/checkpoint_adversary.py`` in small form, and SIGKILLs
during asynchronous saves.

This process saves; a child that never saw the checkpoints restores them (in the saving
process TensorStore's cache can hide a flipped byte). Two children (4 forced host devices
each) do all of it: the first resumes and makes the sharded checkpoint, the second
restores every damaged copy (each child importing jax is most of their cost).
"""

import collections
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
from benchmarks.checkpoint_adversary import PARTS, counterpart, damaged_copies
from benchmarks.checkpoint_kills import sigkill_trial

KILLS = 1  # the full trial is benchmarks/checkpoint_kills.py
FUZZ = 12  # sharded corruptions a part (the full fuzz: python -m benchmarks --only ...)


def _child(modes: str, where, stdin: str = "") -> tuple[list[dict], str]:
    """Runs the fresh-process ``modes`` (4 forced host devices): their JSON lines, stderr."""
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    proc = subprocess.run([sys.executable, fresh.__file__, modes, str(where)], input=stdin,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags.strip()))
    return _lines(proc.stdout), proc.stderr


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
    copies of step MID and of the sharded checkpoint, and the children's verdicts on
    resume and on every copy."""
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
    (where / "sharded").mkdir()
    first, err = _child("resume,make_sharded", where)
    made_sharded = (where / "sharded" / "a").exists()
    fuzz = damaged_copies(str(where / "sharded"), FUZZ, seed=7) if made_sharded else {}
    second, err2 = _child("corrupt,restore_sharded", where, "\n".join(sorted(fuzz)) + "\n")
    rows = {"resume": [r for r in first if "check" in r] or [{"crash": first, "err": err[-3000:]}],
            "corrupt": [r for r in second if "case" in r and r["case"] in made] or
            [{"crash": second[-1:], "err": err2[-3000:]}],
            "sharded": [r for r in second if "case" in r and r["case"] in fuzz]}
    return where, made, rows, fuzz, second[-1:] + [err2[-3000:]]


def test_a_resume_in_a_fresh_process_is_bit_identical(run):
    (row,) = run[2]["resume"]
    assert row == {"check": "resume", "differ": []}, row


def test_every_damaged_file_is_refused_or_harmless(run):
    """Every file of a checkpoint (arrays, Orbax's metadata and manifests, jaxops.json),
    each damaged alone: restoring it raises CheckpointError or gives the intact state bit
    for bit, never a different state or another error. A data file (and jaxops.json) the
    restore reads is refused whatever its damage; the per-process files that Orbax's merge
    left behind are not read at all (every damage of one is harmless)."""
    _, made, rows, *_ = run
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


def test_sharded_corruptions_are_refused_or_harmless(run):
    """The adversary's corruption fuzz on a table over 4 devices (bit flips at random places
    and in named header fields, truncation, files from another checkpoint, shard data
    exchanged, files removed, re-signed never-valid header fields): every damaged copy is
    refused or comes back bit for bit."""
    fuzz, rows = run[3], {row["case"]: row for row in run[2]["sharded"]}
    assert fuzz and set(rows) == set(fuzz), run[4]
    found = {part: collections.Counter() for part in PARTS}
    for case, (part, how) in fuzz.items():
        found[part][rows[case]["outcome"]] += 1
    bad = [(how, rows[case]) for case, (_, how) in fuzz.items()
           if rows[case]["outcome"] not in ("refused", "equal")]
    assert not bad, bad[:5]
    for part in PARTS:
        assert sum(found[part].values()) == FUZZ
        assert found[part]["refused"] > 0, (part, found[part])  # the fuzz does damage


def test_sigkill_during_asynchronous_saves_leaves_the_previous_step(tmp_path):
    """A SIGKILL at a random moment of a run saving asynchronously, resumed from a step
    this process saved: each new process restores the latest step and finds it exact;
    temporary directories never pile up. (The full trial, 20 kills, is the benchmark
    ``benchmarks/checkpoint_kills.py``; here the first process restores a step too, so
    one kill exercises what two did when the first process found none.)"""
    with ocp.CheckpointManager(tmp_path / "kill") as mngr:
        mngr.save(1, args=ht.checkpoint.Save(fresh.kill_state(1)))
        mngr.wait_until_finished()
    trial = sigkill_trial(str(tmp_path), KILLS)
    assert trial["failure"] is None, trial["failure"]
    verified = trial["verified"]
    assert len(verified) == KILLS + 1 and verified[0] == 1, verified
    assert verified == sorted(verified) and None not in verified, verified
    assert max(trial["temporaries"]) <= 2, trial  # the one being written (and one cleaning)
