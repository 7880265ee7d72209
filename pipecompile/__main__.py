"""`python -m pipecompile` runs the command line."""

import sys

from pipecompile.cli import main

sys.exit(main())
