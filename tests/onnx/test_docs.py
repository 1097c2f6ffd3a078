"""docs/onnx.md's first example prints what its comments say (its ``>>>`` sessions are
doctested with every page's by tests/project/test_readme.py)."""

import contextlib
import io
import pathlib
import re

import pytest

pytest.importorskip("onnx")
ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "onnx.md").read_text()


def test_the_first_example_prints_what_it_says():
    script = re.findall(r"^```python\n(.*?)^```", PAGE, re.S | re.M)[0]
    expected = [line[2:] for line in script.splitlines() if line.startswith("# (")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(script, "docs/onnx.md", "exec"), {"__name__": "__main__"})
    assert out.getvalue().splitlines() == expected
