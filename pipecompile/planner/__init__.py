"""The plan search: `pipecompile MODEL --devices N` chooses stages and replicas,
micro-batches, schedule, virtual stages and recomputation for the least predicted step
(docs/PLANNING.md)."""

from pipecompile.planner.plan import Plan, Predicted
from pipecompile.planner.search import SearchResult, Space, search

__all__ = ["Plan", "Predicted", "SearchResult", "Space", "search"]
