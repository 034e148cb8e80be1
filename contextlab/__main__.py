"""``python -m contextlab replay …`` is the same as the ``contextlab`` console script."""

from __future__ import annotations

import sys

from contextlab.cli import main

sys.exit(main())
