"""What the fuzzer's runners share: a time limit on a case (``time_limit``, ``Timeout``) and
the key a failure is counted under (``failure_words``, ``causes``)."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator

__all__ = ["Timeout", "causes", "failure_words", "time_limit"]


class Timeout(Exception):
    """A case that gave no result within its time limit (a hang?)."""


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise ``Timeout`` in the block after ``seconds`` (SIGALRM: main thread only; elsewhere
    the block runs unbounded)."""

    def alarm(signum: int, frame: object) -> None:
        raise Timeout(f"no result within {seconds} s (a hang?)")

    old = signal.signal(signal.SIGALRM, alarm) if _main_thread() else None
    if old is not None:
        signal.alarm(seconds)
    try:
        yield
    finally:
        if old is not None:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def causes(err: BaseException) -> list[BaseException]:
    found, seen = [], {id(err)}
    cause = err.__cause__ or err.__context__
    while cause is not None and id(cause) not in seen:
        found.append(cause)
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return found


def failure_words(text: str, count: int) -> str:
    """The first ``count`` words of ``text``'s first line, names and numbers blanked out,
    so that the same failure on different models has the same key."""
    first = (text.strip().splitlines() or [""])[0]
    first = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "'_'", first)
    first = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", first)
    first = re.sub(r"\b(v|q|k|val|scores|lin|conv|norm|bn|emb|p|buf|stat)\d+\b", "_", first)
    return " ".join(first.split()[:count])
