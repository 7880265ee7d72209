"""The compiler's passes by name, in the order the driver runs them (``--print-after`` takes
them): the driver's table is checked against this list when it is built, so the options can
name the passes without importing the driver."""

from __future__ import annotations

__all__ = ["PASSES", "PASS_ALIASES"]

PASSES = (
    "schedule",
    "trace",
    "batch_coupling",
    "cut_tail",
    "annotate_costs",
    "profile_costs",
    "balance_stages",
    "graph_plan",
    "split_stages",
    "dynamic_dims",
    "activation_memory",
    "insert_recompute",
    "insert_communication",
    "insert_replication",
)
PASS_ALIASES = {"insert_checkpoints": "insert_recompute"}  # --print-after's old pass names
