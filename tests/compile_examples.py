"""Compile every example at every stage count of the suite, 2 micro-batches each: the
``compiled_examples`` fixture's directories, made by a background job (tests/conftest.py).

Usage: ``python tests/compile_examples.py OUT``: writes ``OUT/<example>_<stages>`` for each
example of ``EXAMPLE_NAMES`` and stage count of ``STAGE_COUNTS``, then prints ``done``. The
examples seed their weights, so the directories hold what a test's own ``example_spec`` builds
(compiling never changes the model); each example is traced once for its stage counts.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `tests` imports

from pipecompile.frontend.kept_traces import traces_kept  # noqa: E402
from tests.conftest import EXAMPLE_NAMES, STAGE_COUNTS, compile_example, example_spec  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    with traces_kept():
        for name in EXAMPLE_NAMES:
            spec = example_spec(name)
            for stages in STAGE_COUNTS:
                compile_example(name, stages, out, spec)
    print("done")


if __name__ == "__main__":
    main()
