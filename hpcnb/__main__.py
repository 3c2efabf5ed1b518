"""Entry point for ``python -m hpcnb``."""

from hpcnb.cli import main

raise SystemExit(main())
