"""`python -m app.cli`: the `gpumeter` command where its script is not installed."""

import sys

from app.cli import main

sys.exit(main())
