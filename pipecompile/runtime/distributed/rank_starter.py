"""The process that starts the ranks of `run --nproc N` on this machine: `python -m
pipecompile.runtime.distributed.rank_starter STATUS_FD`, started by ``LocalRanks``.

It imports torch and the worker once, then forks every rank from itself, so a rank begins
with them imported (about 3 s of CPU each on a 2-core machine, which N fresh interpreters
would each spend). It runs no torch op before it forks: a process forked after OpenMP has run
a parallel region hangs in its own next one, so the ranks are never forked from the command
that launches them (a user's Python process, or a test, has run torch).

It ignores SIGINT and SIGTERM (the launcher stops a run by signalling the ranks, and this
process outlives them to say how each ended); its ranks get the default handlers back. It
reads one JSON line on stdin: ``{"worker_args": [...], "ranks": [{env}, ...]}``; each rank
gets its own environment added to this process's (``RANK``, ``WORLD_SIZE``, ...), a session of
its own, and on Linux the SIGKILL this process's death sends it. On the file descriptor
``STATUS_FD`` it writes ``started PID`` for each rank as it forks it, then ``ended PID CODE``
(``CODE`` as ``subprocess`` gives it: negative for a signal) as each one ends, and exits once
all have ended. Ranks keep this process's stdout and stderr (the launcher's terminal and the
pipe it reads).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import traceback
from typing import Any

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_STOPS = (signal.SIGINT, signal.SIGTERM)


def main() -> None:
    # The launcher stops a run by signalling its ranks; this process outlives them to report
    # how each ended (SIGKILL, which the launcher sends last, still ends it, and its ranks).
    for sig in _STOPS:
        signal.signal(sig, signal.SIG_IGN)
    status = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    from pipecompile.runtime.distributed import worker  # imported once, before any fork

    request = json.loads(sys.stdin.readline())
    parent = os.getpid()
    ranks = set()
    for env in request["ranks"]:
        pid = os.fork()
        if pid == 0:
            status.close()
            _become_rank(worker.main, request["worker_args"], env, parent)
        ranks.add(pid)
        status.write(f"started {pid}\n")
    while ranks:
        pid, code = os.wait()
        if pid in ranks:
            ranks.discard(pid)
            status.write(f"ended {pid} {os.waitstatus_to_exitcode(code)}\n")
    status.close()
    os._exit(0)  # no interpreter shutdown (torch's takes about half a second): nothing is left


def _become_rank(run: Any, worker_args: list[str], env: dict[str, str], parent: int) -> None:
    """In the forked child: become one rank and run it; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter has
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setsid()
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the starter died before the line above took effect
                os._exit(code)
        os.environ.update(env)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the starter's stdin was the request
        os.close(devnull)
        sys.argv = ["pipecompile.runtime.distributed.worker", *worker_args]
        code = run(worker_args)  # ends the process itself (os._exit) when it gets that far
    except SystemExit as err:  # argparse
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    main()
