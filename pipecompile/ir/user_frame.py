"""Where in the user's code a graph node came from, as the compiler's messages name it: the
op, its node and module, and the last line of the model's own code in the recorded stack."""

from __future__ import annotations

import torch.fx as fx

from pipecompile.ir.layers import node_module_path

__all__ = ["op_place", "user_line"]


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
