"""Where in the user's code something happened, as messages name it: a graph node's op, node,
module and the last line of the model's own code in its recorded stack; and an exception's
innermost frame in a given file, or outside given folders (one walk for every message that
points at the user's line)."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from pathlib import Path

import torch.fx as fx

from pipecompile.ir.graph.layers import node_module_path

__all__ = ["innermost_in", "innermost_outside", "op_place", "user_line"]


def op_place(node: fx.Node) -> str:
    """The op as a user finds it: its target, node and module, and its line where known."""
    target = getattr(node.target, "__name__", str(node.target))
    where = node_module_path(node)
    parts = [f"node {node.name}"] if node.name != target else []
    parts += [f"in {where}"] if where and where != target else []
    parts += [line] if (line := user_line(node.meta.get("stack_trace") or "")) else []
    return f"{target} ({', '.join(parts)})" if parts else target


def user_line(stack: str) -> str:
    """The last frame of a recorded stack outside torch and pipecompile: where the model's
    own code made the op (``File "model.py", line 12, in forward: x.view(4, 2, 4)``)."""
    lines = stack.strip().splitlines()
    frames = [
        (k, line.strip())
        for k, line in enumerate(lines)
        if line.strip().startswith('File "')
        and "/torch/" not in line
        and "/pipecompile/" not in line
    ]
    if not frames:
        return ""
    k, where = frames[-1]
    code = lines[k + 1].strip() if k + 1 < len(lines) else ""
    return f"{where}: {code}" if code and not code.startswith('File "') else where


def innermost_in(err: BaseException, source: str | Path) -> int | None:
    """The line of ``err``'s innermost traceback frame in the file ``source`` (None where no
    frame is in it)."""
    here = Path(source).resolve()
    lines = [
        f.lineno
        for f in traceback.extract_tb(err.__traceback__)
        if Path(f.filename).resolve() == here
    ]
    return lines[-1] if lines else None


def innermost_outside(err: BaseException, folders: Sequence[Path]) -> traceback.FrameSummary | None:
    """``err``'s innermost traceback frame in none of ``folders`` (the user's code, where
    they are torch's and pipecompile's), or None."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = Path(frame.filename)
        if not any(path.is_relative_to(d) for d in folders):
            return frame
    return None
