"""What a rank prints: pipecompile's own lines whole (one write each, so lines of two threads or
two ranks never share a line), and the model file's output (its prints while its data hooks
run) prefixed ``rank k:``, stdout to stdout and stderr to stderr, where ``launch`` shows it."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

__all__ = ["USER_LINE", "PrefixedLines", "say", "user_output"]

USER_LINE = re.compile(r"^rank \d+: ")  # a line of the model file's output, as relayed
_LOCK = threading.Lock()


def say(line: str, stream: TextIO | None = None) -> None:
    """Write ``line`` and its newline to ``stream`` (stderr) in one write, and flush."""
    stream = stream or sys.stderr
    with _LOCK:
        stream.write(line + "\n")
        stream.flush()


class PrefixedLines(io.TextIOBase):
    """A text stream writing each complete line to ``target`` as ``prefix + line``; a last
    unfinished line is written by ``close``."""

    def __init__(self, target: TextIO, prefix: str) -> None:
        super().__init__()
        self.target, self.prefix, self._pending = target, prefix, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        for line in lines:
            say(self.prefix + line, self.target)
        return len(text)

    def close(self) -> None:
        if self._pending:
            say(self.prefix + self._pending, self.target)
            self._pending = ""
        super().close()


@contextlib.contextmanager
def user_output(rank: int) -> Iterator[None]:
    """While active, what Python code prints (the model file's hooks) is shown as rank
    ``rank``'s: each line prefixed ``rank k:``."""
    out = PrefixedLines(sys.stdout, f"rank {rank}: ")
    err = PrefixedLines(sys.stderr, f"rank {rank}: ")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # type: ignore[type-var]
            yield
    finally:
        out.close()
        err.close()
