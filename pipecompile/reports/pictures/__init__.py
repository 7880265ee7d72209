"""Pictures of a compiled pipeline, drawn with Graphviz.

- ``stage_picture``: the stages, their layers and the values crossing between them;
- ``schedule_picture``: the simulated schedule, one row per device on a time axis;
- ``render``: running Graphviz (or saying how to install it);
- ``pictures``: writing both for an emitted directory (``pipecompile viz``).
"""
