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


def test_runner_writes_only_to_the_cache_dir(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT))
    done = _runner(["--quick", "--only", "nms"], env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ratio" in done.stdout and "\r" not in done.stdout  # stdout is no terminal here
    data = json.loads((cache / "jaxops" / "bench" / "bench.json").read_text())
    assert data["results"] and all(r["ratio"] > 0 and r["best_ratio"] > 0 for r in data["results"])
    assert data["meta"]["glibc_hugepages"] is False
    assert "huge pages for large buffers: off" in done.stdout
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
