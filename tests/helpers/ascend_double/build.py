"""Builds the CANN runtime double into a toolkit-shaped directory (``<root>/lib64``).

The three libraries are compiled with the system C compiler (``$CC``, else ``cc``/``gcc``)
once per process; :func:`compiler` is ``None`` where there is none, and the tests skip.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile

SOURCES = os.path.dirname(os.path.abspath(__file__))
# library -> (source, libraries it links against)
LIBRARIES = {
    "libascendcl.so": ("ascendcl.c", []),
    "libnnopbase.so": ("nnopbase.c", ["ascendcl"]),
    "libopapi.so": ("opapi.c", ["nnopbase", "ascendcl", "m"]),
}


def compiler() -> str | None:
    """The C compiler to use, or ``None``."""
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


@functools.lru_cache(maxsize=None)
def build() -> str:
    """Compiles the double; returns the toolkit root to put in ``ASCEND_HOME_PATH``."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC)")
    root = tempfile.mkdtemp(prefix="jaxops-cann-double-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # loaded copies stay mapped
    lib64 = os.path.join(root, "lib64")
    os.makedirs(lib64)
    for name, (source, deps) in LIBRARIES.items():
        cmd = [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror",
               "-fvisibility=hidden", f"-Wl,-soname,{name}", "-o", os.path.join(lib64, name),
               os.path.join(SOURCES, source), f"-L{lib64}", *[f"-l{d}" for d in deps],
               "-Wl,-rpath,$ORIGIN"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {name} failed:\n{' '.join(cmd)}\n{done.stderr}")
    return root
