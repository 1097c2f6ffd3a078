"""``python -m jaxops``: the jaxops command line."""

from jaxops.cli import main

raise SystemExit(main())
