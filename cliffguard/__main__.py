"""``python -m cliffguard`` = the ``cliffguard`` console script."""

from cliffguard.cli import main

raise SystemExit(main())
