"""Schedules on stage graphs: every program a graph split gives runs to its end, verified with
its messages, and keeps what each schedule promises (GPipe's wait for the whole batch, the
zero-bubble split backward); the chain-only schedules are refused naming why."""

from __future__ import annotations

import random

import pytest

from pipecompile.balance.graph_partition import graph_split
from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Op
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import Topology, side_by_side
from pipecompile.ir.programs.verify_program import verify_program
from pipecompile.ir.programs.whole_batch import waits_for_whole_batch
from pipecompile.passes import insert_communication
from pipecompile.schedules import GRAPHS, REGISTRY, Links, compute_program, graph_program
from tests.balance.test_graph_partition import _random_fork


@pytest.mark.parametrize("seed", range(10))
def test_every_graph_program_runs_to_its_end(seed: int) -> None:
    rng = random.Random(seed)
    reads, fork = _random_fork(rng)
    weights = [rng.randint(1, 9) for _ in reads]
    for devices in (2, 3):
        split = graph_split(weights, fork, devices)
        if split is None:
            continue
        edges = split.edges(reads)
        links = Links.of(len(split.pieces), edges)
        topology = Topology(len(split.pieces), edges)
        assert len(side_by_side(topology, split.stage_device)) >= 2
        for name in GRAPHS:
            for m in (1, 2, 3, 5):
                program = graph_program(name, links, split.stage_device, m)
                linked = insert_communication(program, topology=topology)
                verify_program(linked, topology)  # counts, order, no deadlock
                if REGISTRY[name].on_graph == "fill_drain":
                    assert waits_for_whole_batch(program)
                split_backward = any(x.op == Op.I for d in program.devices for x in d)
                assert split_backward == REGISTRY[name].split_backward


def test_towers_overlap_where_a_chain_runs_them_in_turn() -> None:
    """Two towers of equal cost and a small join, one micro-batch: the graph's step is about
    half the chain's, which runs one tower after the other."""
    links = Links.of(4, frozenset({(0, 1), (0, 2), (1, 3), (2, 3)}))
    topology = Topology(4, frozenset({(0, 1), (0, 2), (1, 3), (2, 3)}))
    graph = graph_program("gpipe", links, (0, 0, 1, 0), 1)
    graph_step = simulate(graph, topology, Costs.from_flops([0, 10, 10, 1])).makespan
    chain = compute_program("gpipe", 2, 1)
    chain_step = simulate(chain, Topology.chain(2), Costs.from_flops([10, 11])).makespan
    assert graph_step == 33 and chain_step == 63


@pytest.mark.parametrize("name", [n for n in REGISTRY if n not in GRAPHS])
def test_chain_only_schedules_are_refused_naming_why(name: str) -> None:
    links = Links.of(3, frozenset({(0, 1), (0, 2)}))
    with pytest.raises(ProgramError, match=f"{name} .*chain plans only"):
        graph_program(name, links, (0, 0, 1), 2)
