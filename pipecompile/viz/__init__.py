"""Pictures of a compiled pipeline, drawn with Graphviz.

- ``layers``: a stage's ops collapsed to their layers (what the manifest's ``layers`` holds);
- ``stage_picture``: the stages, their layers and the values crossing between them;
- ``schedule_picture``: the simulated schedule, one row per device on a time axis;
- ``render``: running Graphviz (or saying how to install it);
- ``pictures``: writing both for an emitted directory (``pipecompile viz``).

Only ``layers`` is imported here, so that emitting a directory needs no Graphviz package.
"""

from pipecompile.viz.layers import layer_groups, layer_of

__all__ = ["layer_groups", "layer_of"]
