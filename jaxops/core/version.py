"""The package's version (``jaxops.__version__``), where every layer may read it."""

VERSION = "0.1.0"
