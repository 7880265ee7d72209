"""An ``OSError`` as the one line a user reads: what could not be done, to which path, why,
and what to do about it."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pipecompile.errors import EmitError, PipecompileError

__all__ = ["disk_message", "os_error", "writing"]

_ADVICE = {
    errno.ENOSPC: "the disk is full; free space there or choose another place",
    errno.EDQUOT: "the disk quota is used up; free space there or choose another place",
    errno.EACCES: "permission denied; choose a place you can write",
    errno.EPERM: "not permitted (a read-only or immutable file?); choose a place you can write",
    errno.EROFS: "the file system is read-only; choose another place",
    errno.ENOTDIR: "a file is in the way where a directory is needed",
    errno.EISDIR: "a directory is in the way where a file is needed",
    errno.EEXIST: "something is in the way",
    errno.ENAMETOOLONG: "a file name is too long; choose a shorter one",
}


def disk_message(doing: str, path: Path | str, err: OSError) -> str:
    """``"cannot {doing} {path}: {reason}"`` for ``err``, naming the file the system names
    when it is another one than ``path``.

    >>> import errno
    >>> disk_message("write train state", "ck", OSError(errno.ENOSPC, "No space left"))
    'cannot write train state ck: the disk is full; free space there or choose another place'
    """
    reason = _ADVICE.get(err.errno or 0) or (err.strerror or str(err) or type(err).__name__)
    named = f" ({err.filename})" if err.filename and str(err.filename) != str(path) else ""
    return f"cannot {doing} {path}{named}: {reason}"


def os_error(err: BaseException) -> OSError | None:
    """The ``OSError`` behind ``err``: ``err`` itself, the one it was raised from or during
    (``torch.save`` to a file object), or the one a safetensors error quotes ("os error 28");
    None if it has none."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, OSError):
            return seen
        quoted = re.search(r"\(os error (\d+)\)", str(seen))
        if quoted:
            code = int(quoted[1])
            return OSError(code, os.strerror(code))
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return None


@contextmanager
def writing(
    doing: str, path: Path | str, *, message: Callable[[OSError], str] | None = None
) -> Iterator[None]:
    """Turn a disk or permission error raised inside into an ``EmitError`` reading
    ``disk_message(doing, path, ...)`` (or ``message(the OSError)``); other errors pass
    through.

    Example:
        >>> with writing("write the plot to", "out.svg"):  # doctest: +SKIP
        ...     Path("out.svg").write_text(svg)
    """
    try:
        yield
    except PipecompileError:
        raise
    except Exception as err:
        cause = os_error(err)
        if cause is None:
            raise
        line = message(cause) if message is not None else disk_message(doing, path, cause)
        raise EmitError(line) from None
