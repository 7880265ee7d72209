"""`python -m pipecompile` runs the command line."""

import sys

from pipecompile.console import main

sys.exit(main())
