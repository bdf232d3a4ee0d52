"""`python -m specwise.cli ...`: the same as the `specwise` command."""

import sys

from specwise.cli import main

sys.exit(main())
