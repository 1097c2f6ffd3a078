"""Doctest collection skips the optional framework layers whose framework is not installed."""

import importlib.util

collect_ignore = [path for path, module in (("jaxops/nnx.py", "flax"),
                                            ("jaxops/equinox.py", "equinox"))
                  if importlib.util.find_spec(module) is None]
