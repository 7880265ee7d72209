"""pipecompile's compiler passes, one per module; each is a pure function of an IR value."""

from pipecompile.ir.graph.saved_bytes import StageMemory
from pipecompile.passes.activation_memory import activation_memory
from pipecompile.passes.annotate_costs import annotate_costs
from pipecompile.passes.balance_stages import balance_stages, min_max_partition
from pipecompile.passes.batch_coupling import batch_coupling, batch_facts
from pipecompile.passes.dynamic_dims import dynamic_dims
from pipecompile.passes.graph_plan import graph_plan
from pipecompile.passes.insert_communication import insert_communication
from pipecompile.passes.insert_recompute import POLICIES, insert_recompute
from pipecompile.passes.insert_replication import insert_replication, parse_replicas
from pipecompile.passes.profile_costs import profile_costs
from pipecompile.passes.split_stages import split_stages

__all__ = [
    "annotate_costs",
    "batch_coupling",
    "batch_facts",
    "balance_stages",
    "min_max_partition",
    "graph_plan",
    "split_stages",
    "dynamic_dims",
    "activation_memory",
    "StageMemory",
    "insert_recompute",
    "POLICIES",
    "insert_communication",
    "insert_replication",
    "parse_replicas",
    "profile_costs",
]
