"""The benchmark runner, ``python -m benchmarks`` (``make bench``), run from the checkout."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _runner(args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, **kwargs)


def test_runner_writes_only_to_the_cache_dir(tmp_path, monkeypatch, capsys):
    # The runner's main() in this process (the suite has jax imported already: a child would
    # spend ~2 s of CPU importing it again); the entry point itself runs as
    # ``python -m benchmarks`` in the test below.
    from benchmarks.__main__ import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.chdir(ROOT)  # run from the checkout, as make bench does
    assert main(["--quick", "--only", "nms"]) == 0
    stdout = capsys.readouterr().out
    assert "ratio" in stdout and "\r" not in stdout  # stdout is no terminal here
    data = json.loads((cache / "jaxops" / "bench" / "bench.json").read_text())
    assert data["results"] and all(r["ratio"] > 0 and r["best_ratio"] > 0 for r in data["results"])
    assert data["meta"]["glibc_hugepages"] is False
    assert "huge pages for large buffers: off" in stdout
    assert (cache / "jaxops" / "bench" / "bench.png").exists()
    assert sorted(p.name for p in ROOT.glob("bench.*")) == []  # never the current directory


def test_runner_help_lists_modules_and_only_refuses_unknown_ones():
    done = _runner(["--help"])
    assert done.returncode == 0
    for name in ("cases_dynamic", "cases_nms", "hashtable"):
        assert f"\n  {name} " in done.stdout
    done = _runner(["--only", "nope"])
    assert done.returncode == 2
    listed = done.stderr.split("--only 'nope': expected one of ")[1].splitlines()[0].split(", ")
    assert listed == sorted(listed) and {"cases_dynamic", "cases_nms", "hashtable"} <= set(listed)
