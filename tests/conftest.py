"""The 8-device checks of a test run (``tests/helpers/eight_devices.py``): one child process,
started in the background once collection has found them, whose tests run last.

A test marked ``@pytest.mark.eight_devices(CHECK)`` reads the result of ``CHECK`` with
``eight_devices.outcome(CHECK)``. The process that loads this file first (the xdist
controller) makes the run's directory for the results; the workers inherit it.
"""

import os
import shutil
import tempfile

import pytest

from tests.helpers import eight_devices

_OWNED = []  # the run's directory, in the process that made it

if eight_devices.RUN_DIR not in os.environ:
    _OWNED.append(tempfile.mkdtemp(prefix="jaxops-8-devices-"))
    os.environ[eight_devices.RUN_DIR] = _OWNED[0]


def pytest_configure(config):
    config.addinivalue_line("markers", f"{eight_devices.MARK}(check): a check the 8-device "
                            "child runs (tests/helpers/eight_devices.py)")


def _check(item) -> str | None:
    mark = item.get_closest_marker(eight_devices.MARK)
    return mark.args[0] if mark else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The 8-device tests run last: by then the child has written their results."""
    items.sort(key=lambda item: _check(item) is not None)


def pytest_collection_finish(session):
    checks = [c for c in map(_check, session.items) if c]
    if checks and not session.config.option.collectonly:
        eight_devices.start(checks)


def pytest_sessionfinish(session):
    eight_devices.finish()


def pytest_terminal_summary(terminalreporter):
    for line in eight_devices.summary(os.environ[eight_devices.RUN_DIR]):
        terminalreporter.write_line(line)


def pytest_unconfigure(config):
    for path in _OWNED:
        eight_devices.stop(path)
        shutil.rmtree(path, ignore_errors=True)
