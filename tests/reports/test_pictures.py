"""The pictures: layer groups in the manifest, the stage and schedule DOT sources, drawing with
Graphviz where it is installed, and the fallback (DOT sources plus one hint) where it is not."""

from __future__ import annotations

import dataclasses
import re
import shutil
import sys
from pathlib import Path

import pytest

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.errors import EmitError
from pipecompile.files.owned import LEDGER
from pipecompile.ir.graph.layers import layer_of
from pipecompile.ir.programs.instr import Instr
from pipecompile.ir.programs.program import Program
from pipecompile.ir.records.manifest import Manifest, read_manifest
from pipecompile.ir.records.sizes import format_size
from pipecompile.reports.pictures.pictures import write_pictures
from pipecompile.reports.pictures.render import RenderError, render
from pipecompile.reports.pictures.schedule_picture import (
    OP_COLORS,
    schedule_dot,
    simulated_timeline,
)
from pipecompile.reports.pictures.stage_picture import stage_dot
from pipecompile.runtime.load import read_program
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, example_spec

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")


def _emit(root: Path, name: str, stages: int, **options: object) -> Path:
    spec = example_spec(name)
    compiled = compile_model(spec.model, spec.inputs, stages=stages, **options)  # type: ignore[arg-type]
    return emit(compiled, root / f"{name}_{stages}", model=ModelRef(spec.path, spec.name, name))


def _read(directory: Path) -> tuple[Manifest, Program]:
    manifest = read_manifest(directory)
    return manifest, read_program(directory / manifest.program)


@pytest.fixture(scope="module")
def gpt3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/gpt.py in 3 stages, 4 micro-batches, 1F1B."""
    root = tmp_path_factory.mktemp("viz")
    return _emit(root, "gpt", 3, microbatches=4, schedule="1f1b")


@pytest.mark.parametrize(
    "path, layer",
    [
        ("transformer.h.3.attn.c_attn", "transformer.h.3"),
        ("h.0", "h.0"),
        ("bert.embeddings.word_embeddings", "bert.embeddings"),
        ("lm_head", "lm_head"),
        ("", ""),
    ],
)
def test_layer_of(path, layer):
    assert layer_of(path) == layer


def test_manifest_layers_count_every_op(gpt3):
    manifest, _ = _read(gpt3)
    ops = manifest.balance.stage_ops
    for j, stage in enumerate(manifest.stages):
        assert sum(count for _, count in stage.layers) == ops[j]
        assert len({path for path, _ in stage.layers}) == len(stage.layers)
    assert ("wte", 1) in manifest.stages[0].layers


def test_stage_dot_has_a_cluster_per_stage_and_labelled_edges(gpt3):
    manifest, program = _read(gpt3)
    source = stage_dot(manifest, program).source
    assert len(re.findall(r"subgraph cluster_\d+ \{", source)) == 3
    for e in manifest.edges:
        shape = "[" + ", ".join(map(str, e.shape)) + "]"
        label = f"{e.value}\\n{shape} {e.dtype}\\n{format_size(e.nbytes)}"
        assert f"s{e.src}_send_{e.value} -> s{e.dst}_recv_{e.value}" in source
        assert f'label="{label}"' in source
    sends = re.findall(r'send_\S+ \[label="send [^"]*" color="([^"]+)" fillcolor="([^"]+)"', source)
    recvs = re.findall(r'recv_\S+ \[label="recv [^"]*" color="([^"]+)" fillcolor="([^"]+)"', source)
    assert sends and recvs and set(sends).isdisjoint(recvs)
    assert "dashed" not in source and "recomputed" not in source


def test_recomputed_stage_is_dashed_and_labelled(gpt3):
    manifest, program = _read(gpt3)
    devices = tuple(
        tuple(Instr("FC", x.stage, x.microbatch) if x.op == "F" and x.stage == 1 else x for x in d)
        for d in program.devices
    )
    source = stage_dot(manifest, dataclasses.replace(program, devices=devices)).source
    clusters = re.findall(r"subgraph (cluster_\d+) \{\n\t\t([^\n]*)", source)
    dashed = [name for name, attrs in clusters if "dashed" in attrs]
    assert dashed == ["cluster_1"]
    assert "recomputed: 4 of 4 forwards" in dict(clusters)["cluster_1"]


def test_older_manifest_without_layers_draws_one_node_per_stage(gpt3):
    manifest, program = _read(gpt3)
    stages = tuple(dataclasses.replace(stage, layers=None) for stage in manifest.stages)
    manifest = dataclasses.replace(manifest, stages=stages)
    source = stage_dot(manifest, program).source
    assert re.findall(r"s(\d)_l0 \[label=\"Stage\1\\n(\d+) ops", source) == [
        (str(j), str(n)) for j, n in enumerate(manifest.balance.stage_ops)
    ]


def test_gpt2_12_layers_stay_a_small_picture(tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    try:
        from hf_gpt2 import build_gpt2, example_inputs
    finally:
        sys.path.remove(str(EXAMPLES))
    model = build_gpt2(n_layer=12, n_embd=32, n_head=2)
    compiled = compile_model(model, example_inputs(), stages=4, microbatches=2, dynamic="none")
    out = emit(compiled, tmp_path / "gpt2", model=ModelRef(None, "gpt2", "gpt2"))
    manifest, program = _read(out)
    layers = [path for s in manifest.stages for path, _ in s.layers]
    assert [f"transformer.h.{k}" for k in range(12)] == [p for p in layers if ".h." in p]
    # 12 blocks, a handful of embeddings, norms and heads, and the symbolic batch's sizes
    assert len(layers) <= 23
    source = stage_dot(manifest, program).source
    nodes = re.findall(r"^\t+(\w+) \[label=", source, flags=re.M)
    assert len(nodes) < 60, len(nodes)  # not ~500 ops


def test_schedule_dot_has_a_row_per_device_and_a_colour_per_kind(tmp_path):
    out = _emit(tmp_path, "mlp", 3, microbatches=4, schedule="zb1p")
    manifest, program = _read(out)
    timeline, unit = simulated_timeline(manifest, program)
    assert unit == "ns"
    source = schedule_dot(timeline, program, unit=unit).source
    assert re.findall(r'^\trow(\d+) \[label="device \1', source, flags=re.M) == ["0", "1", "2"]
    fills = {op: source.count(f'fillcolor="{OP_COLORS[op]}"') for op in ("F", "I", "W")}
    assert fills == {"F": 12 + 1, "I": 12 + 1, "W": 12 + 1}  # 3 stages x 4 micro-batches + key
    assert len({OP_COLORS[op] for op in ("F", "FC", "B", "I", "W")}) == 5
    boxes = re.findall(r'^\td(\d)_\d+ \[label="?(\d+)', source, flags=re.M)
    assert sorted({mb for _, mb in boxes}) == ["0", "1", "2", "3"]
    assert "time (us)" in source and "idle" in source


def test_schedule_falls_back_to_flop_costs(gpt3):
    manifest, program = _read(gpt3)
    manifest = dataclasses.replace(manifest, balance=None)
    timeline, unit = simulated_timeline(manifest, program)
    assert unit == "flops"
    assert "time (forward FLOPs)" in schedule_dot(timeline, program, unit=unit).source


@needs_dot
def test_pictures_are_drawn(gpt3, tmp_path):
    pictures = write_pictures(gpt3, out=tmp_path / "pics")
    assert [p.name for p in pictures.drawn] == ["stages.svg", "schedule.svg"]
    stages, schedule = (p.read_text() for p in pictures.drawn)
    assert stages.count('class="cluster"') == 3
    assert len(re.findall(r">device \d<", schedule)) == 3
    assert main(["viz", str(gpt3), "--format", "png", "-o", str(tmp_path / "png"), "-q"]) == 0
    assert (tmp_path / "png" / "schedule.png").read_bytes()[:4] == b"\x89PNG"


def test_without_graphviz_compile_writes_dot_and_one_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no dot, no neato
    out = tmp_path / "o"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert sorted(p.name for p in out.glob("s*.*") if "stage_" not in p.name) == [
        "schedule.dot",
        "stages.dot",
    ]
    assert err.count("apt-get install graphviz") == 1 and "Traceback" not in err
    assert main(["viz", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cannot draw them" in err and "brew install graphviz" in err
    with pytest.raises(RenderError, match="apt-get install graphviz"):
        render(stage_dot(*_read(out)), tmp_path / "x.svg")


def test_without_graphviz_quiet_compile_prints_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    args = [str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(tmp_path / "o")]
    assert main(args) == 0
    assert capsys.readouterr() == ("", "")
    assert (tmp_path / "o" / "stages.dot").is_file()


def test_a_failing_picture_does_not_fail_the_compile(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("pipecompile.reports.pictures.pictures.stage_dot", broken)
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-o", str(tmp_path / "o")]) == 0
    assert "warning: pictures not drawn: boom" in capsys.readouterr().err
    assert (tmp_path / "o" / "manifest.json").is_file()


def test_viz_errors(tmp_path, capsys):
    assert main(["viz", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipecompile: error:") and "holds no manifest.json" in err
    assert main(["viz", str(tmp_path), "--format", "gif"]) == 2


def test_viz_elsewhere_replaces_only_pictures_it_drew(gpt3, tmp_path):
    """Outside the emitted directory, a picture file is pipecompile's only while its digest
    is in the directory's ledger: its own are redrawn, a user's or a changed one is kept."""
    pics = tmp_path / "pics"
    first = write_pictures(gpt3, out=pics)
    write_pictures(gpt3, out=pics)  # its own: redrawn
    assert (pics / LEDGER).is_file() and first.sources[0].is_file()
    (pics / "stages.dot").write_text("digraph mine {}\n")  # changed since: the user's now
    with pytest.raises(EmitError, match=r"viz -o .*pics: stages\.dot exist there .* never"):
        write_pictures(gpt3, out=pics)
    assert (pics / "stages.dot").read_text() == "digraph mine {}\n"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "schedule.svg").write_text("<svg/>")
    with pytest.raises(EmitError, match=r"schedule\.svg exist there"):
        write_pictures(gpt3, out=mine)
    assert (mine / "schedule.svg").read_text() == "<svg/>"
    assert not (mine / "stages.dot").exists()  # refused before anything was written
