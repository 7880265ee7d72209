"""The helpers over fx graphs every layer shares: the traced model (``traced``), per-node facts
(``node_info``), the stage graph and its send/receive markers (``stage_graph``, ``markers``,
``lower``), what crosses a boundary (``values``, ``size_values``), in-place writes, random
ops, saved bytes, tied and named parameters, leaf modules, layers, split points, dynamic
dimensions, micro-batches, the user's frame in messages and the rounding a check allows."""
