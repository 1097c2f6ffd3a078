"""Pytest fixtures of the CANN runtime double, shared by the Ascend test modules."""

import pytest

from jaxops.backends import ascend
from tests.helpers.ascend_double import build
from tests.helpers.ascend_double.handle import DoubleHooks

CLEAN = {"allocations": 0, "streams": 0, "tensors": 0, "executors": 0}


@pytest.fixture(scope="module")
def toolkit():
    if build.compiler() is None:
        pytest.skip("no C compiler found (set CC) to build the CANN runtime double")
    return build.build()


@pytest.fixture
def double(toolkit, monkeypatch):
    """ASCEND_HOME_PATH at the double, no injected failures, detection probed afresh."""
    for var in ("ASCEND_TOOLKIT_HOME", "JAXOPS_DOUBLE_FAIL", "JAXOPS_DOUBLE_DEVICES",
                "JAXOPS_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ASCEND_HOME_PATH", toolkit)
    assert ascend.detect(refresh=True).available, str(ascend.diagnose())
    hooks = DoubleHooks(toolkit)
    hooks.baseline = hooks.live()  # tests that leak on purpose must not blame later ones
    yield hooks
    ascend.detect(refresh=True)


def live_resources(hooks):
    """Resources alive now that were not alive when the test started."""
    live = hooks.live()
    return {k: live[k] - hooks.baseline[k] for k in CLEAN}
