"""Layer groups: a stage's ops collapsed to the layer (module path prefix) they run in.

A layer is a module path cut after its first numeric part (``transformer.h.3.attn.c_attn`` →
``transformer.h.3``, one element of a ModuleList or Sequential), or its first two parts when it
has none (``bert.embeddings.word_embeddings`` → ``bert.embeddings``). Ops outside every
submodule belong to the layer ``""`` (the model's own forward). The emitter stores the groups
in the manifest (``stages[j].layers``) so the stage picture can be drawn from the directory.
"""

from __future__ import annotations

import torch.fx as fx

from pipecompile.ir.graph.markers import is_recv, is_send
from pipecompile.ir.graph.split_point import is_split_point

__all__ = ["layer_of", "node_module_path", "layer_groups"]

_OPS = ("call_function", "call_method", "call_module")


def layer_of(path: str) -> str:
    """The layer a module path belongs to.

    >>> layer_of("transformer.h.3.attn.c_attn"), layer_of("bert.embeddings.dropout")
    ('transformer.h.3', 'bert.embeddings')
    """
    parts = path.split(".") if path else []
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: k + 1])
    return ".".join(parts[:2])


def node_module_path(node: fx.Node) -> str:
    """The innermost module path ``node`` runs in (``""`` outside every submodule).

    Read from ``nn_module_stack``, which both tracers record and which, unlike a
    ``call_module`` target, survives the renaming of submodules when stages are split.
    """
    stack = node.meta.get("nn_module_stack") or {}
    paths = [str(v[0]) for v in stack.values() if v and v[0]]
    if paths:
        return paths[-1]
    return str(node.target) if node.op == "call_module" else ""


def layer_groups(graph: fx.Graph) -> list[tuple[str, int]]:
    """``(layer, op count)`` for the graph's ops, in the order each layer first appears.

    Send, receive and split-point markers are not ops and are not counted.
    """
    counts: dict[str, int] = {}
    for node in graph.nodes:
        if node.op not in _OPS or is_recv(node) or is_send(node) or is_split_point(node):
            continue
        layer = layer_of(node_module_path(node))
        counts[layer] = counts.get(layer, 0) + 1
    return list(counts.items())
