"""python -m sparkgrad: the same as the sparkgrad console script."""

import sys

from sparkgrad.cli import main

sys.exit(main())
