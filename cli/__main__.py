"""`python -m cli`: the `relay` command without the console script (tests, `relay up`)."""

import sys

from cli.main import main

sys.exit(main())
