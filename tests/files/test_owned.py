"""What pipecompile recognises as its own file: one marker per kind, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from pipecompile.files.owned import (
    EXPORT_MARK,
    EXPORT_METADATA,
    SVG_MARK,
    copied_digests,
    is_our_index,
    is_our_latest,
    is_our_metrics,
    is_our_safetensors,
    is_our_step_dir,
    is_our_svg,
    sha256,
)


def test_a_safetensors_file_is_ours_only_with_the_export_marker(tmp_path):
    ours, theirs, junk = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c"
    save_file({"w": torch.zeros(2)}, str(ours), metadata=EXPORT_METADATA)
    save_file({"w": torch.zeros(2)}, str(theirs), metadata={"format": "pt"})
    junk.write_bytes(b"\xff" * 20)
    assert is_our_safetensors(ours)
    assert not is_our_safetensors(theirs) and not is_our_safetensors(junk)
    assert not is_our_safetensors(tmp_path / "missing")


def test_an_index_is_ours_only_with_the_marker_and_lists_what_it_copied(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    index = tmp_path / "model.safetensors.index.json"
    meta = {"written_by": EXPORT_MARK, "copied": {"config.json": sha256(config)}}
    index.write_text(json.dumps({"metadata": meta, "weight_map": {}}))
    assert is_our_index(index) and copied_digests(index) == {"config.json": sha256(config)}
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": {}}))
    assert not is_our_index(index) and copied_digests(index) == {}
    index.write_text("[1, 2")
    assert not is_our_index(index)


def test_an_svg_is_ours_only_with_the_plot_comment(tmp_path):
    ours, theirs = tmp_path / "a.svg", tmp_path / "b.svg"
    ours.write_text(f'<?xml version="1.0"?>\n{SVG_MARK}\n<svg/>')
    theirs.write_text("<svg/>")
    assert is_our_svg(ours) and not is_our_svg(theirs)
    older = tmp_path / "c.svg"  # drawn by plot before the marker: its exact opening
    older.write_text(Path(__file__).parents[2].joinpath("docs/char_lm_training.svg").read_text())
    assert is_our_svg(older)


def test_a_metrics_file_is_ours_when_every_complete_line_is_a_record(tmp_path):
    path = tmp_path / "m.jsonl"
    record = json.dumps({"kind": "train", "step": 1, "time": 1.0})
    for text, ours in [
        ("", True),
        (record + "\n", True),
        (record + "\n" + '{"kind": "tra', True),  # a run killed mid-line
        (record + "\n\n" + record + "\n", True),
        ("my notes\n", False),
        ('{"a": 1}\n', False),
        (record + "\nnot json\n", False),
    ]:
        path.write_text(text)
        assert is_our_metrics(path) is ours, text


def test_saved_steps_and_latest(tmp_path):
    step = tmp_path / "step_3"
    step.mkdir()
    assert not is_our_step_dir(step)
    (step / "meta.json").write_text('{"format": "pipecompile-checkpoint/1", "step": 3}')
    assert is_our_step_dir(step)
    latest = tmp_path / "latest"
    latest.write_text("step_3\n")
    assert is_our_latest(latest)
    latest.write_text("my latest thoughts\n")
    assert not is_our_latest(latest)
