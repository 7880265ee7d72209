"""`python -m pipecompile` runs the command line."""

import sys

from pipecompile.surfaces.console import main

sys.exit(main())
