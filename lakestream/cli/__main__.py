"""`python -m lakestream` = the `lakestream` command."""

import sys

from lakestream.cli import main

sys.exit(main())
