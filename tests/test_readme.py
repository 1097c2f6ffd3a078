"""The README's Python snippets run as printed: REPL sessions (``>>>``) are doctested with
their printed output; plain scripts run in a fresh interpreter (they may change global JAX
settings, such as the compilation cache, that must not leak into the suite)."""

import doctest
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "README.md")) as readme:
    BLOCKS = re.findall(r"^```python\n(.*?)^```", readme.read(), re.S | re.M)
SESSIONS = [b for b in BLOCKS if b.lstrip().startswith(">>>")]
SCRIPTS = [b for b in BLOCKS if not b.lstrip().startswith(">>>")]


def test_the_readme_has_both_kinds():
    assert len(SESSIONS) >= 4 and len(SCRIPTS) >= 2


@pytest.mark.parametrize("i", range(len(SESSIONS)))
def test_repl_session_prints_what_it_claims(i):
    test = doctest.DocTestParser().get_doctest(SESSIONS[i], {}, f"README session {i}",
                                               "README.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0, f"README session {i} printed something else (see above)"


@pytest.mark.parametrize("i", range(len(SCRIPTS)))
def test_script_runs(i, tmp_path):
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", SCRIPTS[i]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
