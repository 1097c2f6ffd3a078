"""The Python in README.md and in every page of docs/ runs as printed: REPL sessions
(``>>>``) are doctested with their printed output; plain scripts run in a child interpreter
(they may change global JAX settings, such as the compilation cache, that must not leak into
the suite), all of them in one child: each in a fresh namespace, folder and ``HOME``, with
the JAX settings it changed put back after it. Blocks fenced as ```` ```python ```` run; a sketch that cannot run (a cluster's
address, ``...`` for arguments) is fenced without a language. Every relative link between
the pages, and every ``#anchor`` in one, resolves."""

import doctest
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.util import ROOT

PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def _blocks(page: str) -> list[str]:
    """The page's ```python blocks, dedented (a block may sit inside a list item)."""
    found = re.findall(r"^( *)```python\n(.*?)^\1```", _read(page), re.S | re.M)
    return [re.sub(rf"(?m)^{indent}", "", body) for indent, body in found]


SESSIONS, SCRIPTS = [], []
for _page in PAGES:
    for _i, _block in enumerate(_blocks(_page)):
        _kind = SESSIONS if _block.lstrip().startswith(">>>") else SCRIPTS
        _kind.append(pytest.param(_page, _block, id=f"{_page}:{_i}"))


def test_the_pages_are_collected():
    # The README's three quickstarts are sessions; docs/ holds the rest (both kinds). A
    # fence the pattern above missed would drop a block silently: these counts catch it.
    assert "docs/embeddings.md" in PAGES and "docs/ARCHITECTURE.md" in PAGES
    assert sum(p.values[0] == "README.md" for p in SESSIONS) >= 3
    assert len(SESSIONS) >= 9 and len(SCRIPTS) >= 5
    for page in PAGES:
        fences = re.findall(r"^ *```(\S*)", _read(page), re.M)
        odd = {f for f in fences if f.lower().startswith("py") and f != "python"}
        assert not odd, f"{page}: fence {odd} is not run; write ```python (or no language)"


@pytest.mark.parametrize("page, block", SESSIONS)
def test_repl_session_prints_what_it_claims(page, block):
    test = doctest.DocTestParser().get_doctest(block, {}, f"{page} session", page, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    import jax

    with jax.enable_x64(False):  # what a reader's session prints with JAX's defaults
        runner.run(test)
    assert runner.failures == 0, f"a session of {page} printed something else (see above)"


# One child runs every script: a new Python that imports jax costs ~1.5 s of CPU before
# it does anything, more than most scripts. Each script still starts from a fresh namespace
# (a missing import fails: names do not carry over), in its own folder and HOME, and every
# JAX setting it changed (the compilation cache of docs/benchmarks.md) is put back after it.
_RUN_SCRIPTS = """
import json, os, sys, traceback
import jax
scripts, results = json.load(open(sys.argv[1])), []
for name, block, folder in scripts:
    os.makedirs(folder)
    os.chdir(folder)
    os.environ["HOME"] = folder
    settings = dict(jax.config.values)
    try:
        exec(compile(block, name, "exec"), {"__name__": "__main__"})
        results.append(None)
    except BaseException:
        results.append(traceback.format_exc()[-2000:])
    for key, value in settings.items():
        if jax.config.values.get(key) != value:
            jax.config.update(key, value)
json.dump(results, open(sys.argv[2], "w"))
"""


def test_scripts_run(tmp_path):
    names = [p.id for p in SCRIPTS]
    scripts = [(name, p.values[1], str(tmp_path / f"script{i}")) for i, (name, p) in
               enumerate(zip(names, SCRIPTS))]
    (tmp_path / "scripts.json").write_text(json.dumps(scripts))
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", _RUN_SCRIPTS, str(tmp_path / "scripts.json"),
                          str(tmp_path / "results.json")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"the scripts' child failed:\n{run.stderr[-2000:]}"
    results = json.loads((tmp_path / "results.json").read_text())
    failed = {name: error for name, error in zip(names, results) if error is not None}
    assert len(results) == len(scripts) and not failed, "scripts that failed:\n" + "\n".join(
        f"{name}:\n{error}" for name, error in failed.items())


def _anchors(page: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^ *```.*?^ *```", "", _read(page), flags=re.S | re.M)  # no headings in code
    slugs = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        slugs.add(slug)
    return slugs


def test_links_between_pages_resolve():
    broken = []
    for page in PAGES:
        text = re.sub(r"^ *```.*?^ *```", "", _read(page), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
                continue
            path, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(ROOT, linked)):
                broken.append(f"{page}: {target} (no {linked})")
            elif anchor and linked.endswith(".md") and anchor not in _anchors(linked):
                broken.append(f"{page}: {target} (no heading #{anchor} in {linked})")
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)
