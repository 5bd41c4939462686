"""``python -m invariant_cluster``: the command line (see :mod:`invariant_cluster.cli`)."""

import sys

from .cli import main

sys.exit(main())
