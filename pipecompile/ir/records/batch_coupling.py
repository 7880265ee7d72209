"""Where a model mixes the samples of a batch: the compile's record of each coupling.

A pipeline splits every mini-batch into micro-batches (and ``--dp`` copies split it again), so
a value that depends on other samples than its own (a product over the batch such as CLIP's
image-text logits, a reduction, sort or normalisation over the batch, batch norm in training
mode, a loss over the whole batch) would be computed on part of the batch only. The
``batch_coupling`` pass finds each op where that starts; the manifest lists them
(``batch_coupling``) and the compile summary states each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

__all__ = ["Coupling", "CouplingKind", "KINDS", "mixes", "loss_over_batch", "coupling_lines"]

# "batch norm": statistics over the batch in training mode (the pipeline keeps them per
# micro-batch, as every pipeline does: stated, not refused); "tail": a mixing op after which
# the model only computes its outputs (no layer with weights), such as a contrastive head;
# "middle": a mixing op whose values feed more of the model's layers; "loss": the loss
# function mixes the samples of its batch (it is not a mean of per-sample terms)
CouplingKind = Literal["batch norm", "tail", "middle", "loss"]
KINDS: tuple[str, ...] = ("batch norm", "tail", "middle", "loss")


@dataclass(frozen=True)
class Coupling:
    """One op that mixes samples: its kind, the op as a user finds it (target, node, module
    and line) and the traced node's name (empty for the loss function)."""

    kind: CouplingKind
    op: str
    node: str = ""

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "op": self.op, "node": self.node}

    @classmethod
    def from_json(cls, raw: dict[str, str]) -> Coupling:
        kind = raw["kind"]
        if kind not in KINDS:
            raise ValueError(f"batch_coupling kind {kind!r} is none of {', '.join(KINDS)}")
        return cls(cast(CouplingKind, kind), str(raw["op"]), str(raw.get("node", "")))


def mixes(couplings: tuple[Coupling, ...]) -> tuple[Coupling, ...]:
    """The couplings that change what the model computes when its batch is split (all but
    batch norm, whose per-micro-batch statistics are the pipeline's stated semantics)."""
    return tuple(c for c in couplings if c.kind != "batch norm")


def loss_over_batch(couplings: tuple[Coupling, ...] | None) -> Coupling | None:
    """The loss function's coupling, where it is one: the runtime computes that loss once a
    step on every micro-batch's outputs joined (``runtime/state/whole_loss``)."""
    return next((c for c in couplings or () if c.kind == "loss"), None)


def coupling_lines(
    couplings: tuple[Coupling, ...] | None, rows: int, cut: bool = False
) -> list[str]:
    """The compile summary's lines on batch coupling (``rows``: a micro-batch's; ``cut``:
    the tail was cut off, to run on the whole batch)."""
    if couplings is None:
        return ["batch coupling: not analysed (a model on the meta device is not run)"]
    if not couplings:
        return ["batch coupling: none (every value depends on its own sample only)"]
    lines = []
    norms = [c.node for c in couplings if c.kind == "batch norm"]
    if norms:
        named = ", ".join(norms[:3]) + (f" and {len(norms) - 3} more" if len(norms) > 3 else "")
        lines.append(
            f"batch coupling: batch norm in training mode ({named}): statistics per "
            f"micro-batch of {rows} rows, as in every pipeline"
        )
    said = {
        "tail": "mixes the samples of the batch, and only the outputs follow it",
        "middle": "mixes the samples of the batch, and more layers follow it",
        "loss": "mixes the samples of its batch",
    }
    for c in mixes(couplings):
        exact = (
            "computed once a step on every micro-batch's outputs joined, exactly"
            if c.kind == "loss"
            else "cut off with what follows it (tail.py), run once a step on every "
            "micro-batch's values joined, exactly"
            if c.kind == "tail" and cut
            else "exact as compiled (one micro-batch, no replicas)"
        )
        gathered = c.kind == "loss" or (c.kind == "tail" and cut)
        refused = (
            "--dp copies gather their values for it; run refuses --accumulate, which would "
            "split the batch"
            if gathered
            else "run refuses --dp and --accumulate, which would split the batch"
        )
        lines.append(f"batch coupling: {c.op} {said[c.kind]}: {exact}; {refused}")
    return lines
