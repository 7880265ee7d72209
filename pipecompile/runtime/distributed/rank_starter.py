"""The process that starts the ranks of `run --nproc N` on this machine: `python -m
pipecompile.runtime.distributed.rank_starter SOCKET_FD`, started and kept by ``LocalRanks``.

It imports torch and the worker once, and what a rank would import lazily on its first step
(``_warm``: torch's compiler front end, which the first initialiser or optimizer loads), then
forks every rank from itself, so a rank begins with them imported (about 2 s of CPU for torch
and 1.5 s for the rest, in each rank of each launch, which a fresh interpreter would spend: a
2-rank, 2-step run of examples/char_lm.py went from 4.5-5 s to 0.8-1.0 s). It runs no torch op
before it forks: a process forked after OpenMP has run a parallel region hangs in its own next
one, so the ranks are never forked from the process that launches them (a user's Python
process, or a test, has run torch). One starter serves every launch of the process that started
it: the second `--nproc` run of a Python session starts its ranks at once.

Each launch sends one request on the socket: a JSON object (``worker_args``, ``cwd``, ``env``,
``ranks``: each rank's own variables, and optionally ``entry``, a ``MODULE:FUNCTION`` the ranks
run with ``worker_args`` instead of the worker's argv entry: `run --nproc` asks for
``worker:run_record`` with the job's JSON record as its one argument) with three file
descriptors, the launch's status
pipe, the pipe for the ranks' stderr and the stdout they write to. A rank gets that
environment and working directory, a session of its own, and on Linux the SIGKILL this
process's death sends it. On the status pipe this process writes ``started PID`` for each
rank as it forks it, then ``ended PID CODE`` (``CODE`` as ``subprocess`` gives it: negative
for a signal) as each one ends, and closes it when all of the launch's ranks have ended.

It ignores SIGINT and SIGTERM (the launcher stops a run by signalling the ranks, and this
process outlives them to say how each ended); its ranks get the default handlers back. It
ends when the launcher closes the socket (or dies: on Linux it is SIGKILLed with it).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Any, TextIO

__all__ = ["main", "receive", "send_request", "serve"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_STOPS = (signal.SIGINT, signal.SIGTERM)
_REAP_S = 0.02  # how often ended ranks are looked for while some run
_LENGTH = struct.Struct("!Q")


def send_request(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """Send ``request`` and ``fds`` as one message (its length first)."""
    body = json.dumps(request).encode()
    data = _LENGTH.pack(len(body)) + body
    sent = socket.send_fds(sock, [data], fds)
    if sent < len(data):
        sock.sendall(data[sent:])


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next request and its file descriptors; None once the sender has closed."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
    if not data:
        return None
    while len(data) < _LENGTH.size:
        data += _more(sock, _LENGTH.size - len(data))
    (length,) = _LENGTH.unpack_from(data)
    body = data[_LENGTH.size :]
    while len(body) < length:
        body += _more(sock, length - len(body))
    return json.loads(body), list(fds)


def _more(sock: socket.socket, count: int) -> bytes:
    chunk = sock.recv(count)
    if not chunk:
        raise EOFError("the launcher closed the socket inside a request")
    return chunk


def main() -> None:
    serve(socket.socket(fileno=int(sys.argv[1])))


def serve(sock: socket.socket) -> None:
    """Start the ranks of each launch requested on ``sock`` until the launcher closes it; then
    end this process (``local_ranks`` forks a process that has run no torch op into this)."""
    for sig in _STOPS:
        signal.signal(sig, signal.SIG_IGN)
    failure = None
    try:
        from pipecompile.runtime.distributed import worker  # imported once, before any fork

        _warm()
    except BaseException:  # each launch shows it as its ranks' stderr, and starts none
        failure = traceback.format_exc()
    parent = os.getpid()
    launches: dict[int, TextIO] = {}  # a running rank's pid -> its launch's status pipe
    while True:
        ready, _, _ = select.select([sock], [], [], _REAP_S if launches else None)
        if ready:
            got = receive(sock)
            if got is None:
                break
            if failure is None:
                run = _entry(got[0].get("entry")) if got[0].get("entry") else worker.main
                _start(sock, run, *got, launches, parent)
            else:
                os.write(got[1][1], failure.encode())
                for fd in got[1]:
                    os.close(fd)
        _reap(launches)
    os._exit(0)  # no interpreter shutdown (torch's takes about half a second); on Linux any
    # rank still running is SIGKILLed with this process


def _entry(name: str) -> Any:
    """``MODULE:FUNCTION`` that a launch's ranks run instead of the worker (the calibration's
    message probe), imported here before the fork."""
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


def _warm() -> None:
    """Import what every rank imports on its first use: torch's compiler front end, which its
    first initialiser or optimizer loads lazily (about 1.5 s of CPU in each rank of each
    launch otherwise). Imports run no torch op, so forking stays safe."""
    import torch._dynamo  # noqa: F401 - torch.optim came with torch


def _start(
    sock: socket.socket,
    run: Any,
    request: dict[str, Any],
    fds: list[int],
    launches: dict[int, TextIO],
    parent: int,
) -> None:
    """Fork the request's ranks; each reports on the launch's status pipe."""
    status_fd, stderr_fd, stdout_fd = fds
    status = os.fdopen(status_fd, "w", buffering=1)
    for rank_env in request["ranks"]:
        pid = os.fork()
        if pid == 0:
            sock.close()
            for other in {*launches.values(), status}:
                other.close()
            env = {**request["env"], **rank_env}
            outputs = (stdout_fd, stderr_fd)
            _become_rank(run, request["worker_args"], env, request["cwd"], outputs, parent)
        launches[pid] = status
        status.write(f"started {pid}\n")
    os.close(stderr_fd)
    os.close(stdout_fd)
    if status not in launches.values():  # no rank asked for
        status.close()


def _reap(launches: dict[int, TextIO]) -> None:
    """Report every rank that has ended; close a launch's pipe when its last one has."""
    while launches:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = launches.pop(pid, None)
        if status is None:
            continue
        status.write(f"ended {pid} {os.waitstatus_to_exitcode(code)}\n")
        if status not in launches.values():
            status.close()


def _become_rank(
    run: Any,
    worker_args: list[str],
    env: dict[str, str],
    cwd: str,
    outputs: tuple[int, int],
    parent: int,
) -> None:
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
        devnull = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((devnull, 0), *zip(outputs, (1, 2))):
            os.dup2(source, target)
            os.close(source)
        os.environ.clear()
        os.environ.update(env)
        if sys.path and sys.path[0] == os.getcwd():  # `python -m` put the starter's there
            sys.path[0] = cwd
        os.chdir(cwd)
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
