"""The balancer's machine model: boundary bytes, per-op saved bytes, schedule memory counts,
and the compile options that feed it (speeds, bandwidth, memory limits, workers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.fx as fx
from torch import nn

from pipecompile.balance.cut_bytes import cut_bytes
from pipecompile.balance.node_memory import node_memory
from pipecompile.frontend.tracer import trace
from pipecompile.ir.programs.memory_model import peak_weight_copies, stored_counts
from pipecompile.passes import activation_memory, annotate_costs, balance_stages, split_stages
from pipecompile.passes.balance_stages import atoms_of, compute_nodes
from pipecompile.passes.insert_recompute import insert_recompute
from pipecompile.schedules import compute_program
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, example_spec

GPT = str(EXAMPLES / "gpt.py")


class _Skip(nn.Module):
    def forward(self, x):
        a = x * 2  # 4x8 floats = 128 bytes, read again at the end
        b = a + 1
        c = b.sum(dim=1)  # 4 floats
        return c + a.sum(dim=1)


def test_cut_bytes_count_every_value_alive_across_a_boundary():
    module = fx.symbolic_trace(_Skip())
    traced = trace(module, {"x": torch.randn(4, 8)})
    ops = compute_nodes(traced.module.graph)
    forward, backward = cut_bytes(traced.module.graph, atoms_of(ops))
    # boundaries before: mul, add (a), sum (a, b), sum of a (a, c), add (c, a's sum)
    assert list(forward) == [0, 128, 256, 144, 32, 0]
    assert list(backward) == list(forward)


def test_integer_values_carry_no_gradient():
    class Ints(nn.Module):
        def forward(self, x):
            ids = (x > 0).long()
            return (ids * 3).float().sum()

    traced = trace(Ints(), {"x": torch.randn(4, 8)})
    ops = compute_nodes(traced.module.graph)
    forward, backward = cut_bytes(traced.module.graph, atoms_of(ops))
    assert forward[2] == 4 * 8 * 8 and backward[2] == 0  # the int64 ids cross boundary 2


@pytest.mark.parametrize("name", ["gpt", "mlp", "resnet"])
def test_saved_bytes_per_op_add_up_to_the_stage_analysis(name):
    spec = example_spec(name)
    traced = trace(spec.model, spec.inputs)
    annotated = annotate_costs(traced.module, root=traced.root)
    per_op = node_memory(annotated)
    whole = activation_memory(split_stages(balance_stages(annotated, stages=1)[0], traced=traced))
    assert sum(per_op.values()) == whole[0].saved > 0


def test_stored_counts_follow_the_schedule_and_checkpointing():
    def counts(name, **kw):
        return [sorted(stored_counts(d)) for d in compute_program(name, 4, 8, **kw).devices]

    assert counts("gpipe") == [[(8, 0)]] * 4
    assert counts("1f1b") == [[(4, 0)], [(3, 0)], [(2, 0)], [(1, 0)]]
    always = insert_recompute(compute_program("1f1b", 4, 8), memory=(), flops=(), policy="always")
    assert [sorted(stored_counts(d)) for d in always.devices] == [
        [(1, 4)],
        [(1, 3)],
        [(1, 2)],
        [(1, 1)],
    ]


def test_weight_copies_of_pipedream():
    program = compute_program("pipedream", 4, 8)
    assert [peak_weight_copies(d) for d in program.devices] == [4, 3, 2, 1]
    vsync = compute_program("pipedream", 4, 8, vertical_sync=True)
    assert [peak_weight_copies(d) for d in vsync.devices] == [4, 4, 4, 4]
    assert [peak_weight_copies(d) for d in compute_program("1f1b", 4, 8).devices] == [0, 0, 0, 0]


def _compile(tmp_path: Path, *options: str) -> dict:
    out = tmp_path / "o"
    args = [GPT, "--stages", "4", "--microbatches", "4", "--chain", "-q", "-o", str(out), *options]
    assert main(args) == 0
    return json.loads((out / "manifest.json").read_text())["balance"]


def test_a_slow_device_gets_less_compute(tmp_path):
    even = _compile(tmp_path)
    slow = _compile(tmp_path, "--device-speed", "1,1,0.5,1")
    assert slow["stage_balanced"][2] < 0.7 * even["stage_balanced"][2]
    assert slow["bottleneck"] == max(slow["stage_costs"]) >= even["bottleneck"]
    assert slow["stage_compute"][2] == pytest.approx(2 * 3 * slow["stage_balanced"][2] / 1000)


def test_slow_links_cost_time_and_infinite_links_none(tmp_path):
    slow = _compile(tmp_path, "--bandwidth", "100MB/s")
    free = _compile(tmp_path, "--bandwidth", "inf")
    assert all(c == 0 for c in free["stage_comm"])
    assert slow["bottleneck"] > free["bottleneck"]
    assert slow["stage_comm"][1] == pytest.approx(slow["stage_comm_bytes"][1] / 100e6 * 1e9)


def test_the_split_fits_the_memory_limit(tmp_path):
    free = _compile(tmp_path, "--schedule", "1f1b")
    limits = [1.2 * 2**20, 1.5 * 2**20, 1.5 * 2**20, 1.5 * 2**20]
    tight = _compile(
        tmp_path, "--schedule", "1f1b", "--memory-limit", "1.2MiB,1.5MiB,1.5MiB,1.5MiB"
    )
    assert tight["stage_balanced"] != free["stage_balanced"]
    assert tight["bottleneck"] > free["bottleneck"]
    assert all(m <= limit for m, limit in zip(tight["stage_memory"], limits))
    # the predicted memory: 4 parameter copies (AdamW) plus 4 micro-batches' activations on
    # device 0 under 1f1b, each counted with the stage's input bytes
    assert tight["stage_memory"][0] >= 4 * tight["stage_params"][0]


def test_workers_choose_replicas_the_runtime_uses(tmp_path):
    balance = _compile(tmp_path, "--workers", "6")
    assert sum(balance["replicas"]) <= 6 and max(balance["replicas"]) > 1
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["replicas"] == balance["replicas"]
    program = (tmp_path / "o" / "program.txt").read_text()
    assert "ALLREDUCE_REPLICAS" in program


@pytest.mark.parametrize(
    "options, message",
    [
        (["--device-speed", "1,2"], "2 speeds for 4 devices"),
        (["--device-speed", "1,0,1,1"], "must be positive"),
        (["--bandwidth", "fast"], "write bytes per second"),
        (["--memory-limit", "10KiB"], "no split into 4 stages fits --memory-limit"),
        (["--memory-limit", "1GiB", "--memory-budget", "1GiB"], "cannot be combined"),
        (["--workers", "3"], "cannot run 4 stages"),
        (["--workers", "6", "--replicate", "2,2,1,1"], "give one of the two"),
        (["--workers", "6", "--schedule", "pipedream"], "cannot replicate"),
        (["--memory-limit", "1GiB", "--schedule", "interleaved"], "one stage per device"),
    ],
)
def test_machine_option_errors(tmp_path, capsys, options, message):
    args = [GPT, "--stages", "4", "--microbatches", "4", "-q", "-o", str(tmp_path / "o")]
    assert main([*args, *options]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
