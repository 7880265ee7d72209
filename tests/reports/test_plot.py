"""`pipecompile plot`'s module: reading metrics lines, the last run, the SVG's curves and axes,
and writing the picture."""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pipecompile.errors import PipecompileError
from pipecompile.reports import plot
from pipecompile.reports.plot import last_run, nice_ticks, plot_svg, read_metrics, write_plot

SVG = "{http://www.w3.org/2000/svg}"


def train(step: int, loss: float, **extra: Any) -> dict[str, Any]:
    record = {"kind": "train", "step": step, "epoch": 1, "loss": loss, "lr": 1e-3}
    record.update(step_ms=12.5, samples_per_s=600.0 + step, tokens_per_s=None, skipped=False)
    return {**record, "bubble": 0.3, "peak_memory": [1, 2], "time": 1.7e9 + step, **extra}


def start(**extra: Any) -> dict[str, Any]:
    return {"kind": "start", "time": 1.7e9, "directory": "out", "steps": None, **extra}


def write_lines(path: Path, records: list[dict[str, Any]]) -> Path:
    # json.dumps writes NaN and Infinity tokens, as `pipecompile run` does.
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def two_runs() -> list[dict[str, Any]]:
    first = [start(), *(train(s, 9.0 + s) for s in range(1, 11)), {"kind": "eval", "step": 10}]
    second = [
        start(precision="bf16"),
        train(1, 4.0),
        train(2, 3.5, extra_key="ignored"),
        train(3, math.nan),
        train(4, 3.0),
        train(5, 2.0, skipped=True),
        {"kind": "eval", "step": 4, "epoch": 1, "loss": 3.2, "time": 1.0},
        {"kind": "something new", "step": 5, "loss": 100.0},
        train(6, math.inf),
        train(7, 2.5),
        {"kind": "eval", "step": 7, "epoch": 1, "loss": 2.9, "time": 2.0},
    ]
    return first + second


def curve(root: ET.Element, name: str) -> list[tuple[float, float]]:
    (line,) = [e for e in root.iter(f"{SVG}polyline") if e.get("class") == name]
    return [(float(x), float(y)) for x, y in (p.split(",") for p in line.get("points").split())]


def markers(root: ET.Element, name: str) -> list[tuple[float, float]]:
    found = [e for e in root.iter(f"{SVG}circle") if e.get("class") == f"{name}-marker"]
    return [(float(e.get("cx")), float(e.get("cy"))) for e in found]


def texts(root: ET.Element) -> list[str]:
    return [e.text or "" for e in root.iter(f"{SVG}text")]


def test_only_the_last_runs_finite_applied_points_are_drawn(tmp_path):
    records = read_metrics(write_lines(tmp_path / "metrics.jsonl", two_runs()))
    root = ET.fromstring(plot_svg(last_run(records), "run"))
    loss = curve(root, "train-loss")
    # steps 1, 2, 4, 7: step 3 is NaN, 5 skipped, 6 infinite; the first run's 10 steps are gone
    assert len(loss) == 4
    xs, ys = zip(*loss)
    assert list(xs) == sorted(xs) and len(set(xs)) == 4
    # losses 4.0 > 3.5 > 3.0 < 2.5 reversed: a lower loss is drawn higher up (larger y)
    assert ys[0] < ys[1] < ys[2] < ys[3]
    assert markers(root, "eval-loss") == curve(root, "eval-loss")
    assert len(markers(root, "eval-loss")) == 2
    assert len(curve(root, "throughput")) == 7  # throughput of every step, skipped ones too
    assert "samples/s" in texts(root) and "tokens/s" not in texts(root)
    assert {"train loss", "eval loss", "loss", "step"} <= set(texts(root))


def test_points_land_on_their_tick_positions():
    records = [train(s, 10.0 * s) for s in (1, 2, 3, 4)]  # x ticks 1..4, loss ticks 10..40
    root = ET.fromstring(plot_svg(records, "ticks"))
    loss_panel = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "panel loss")
    labels = {e.text: (float(e.get("x")), float(e.get("y"))) for e in loss_panel.iter(f"{SVG}text")}
    (x1, y1), *_, (x4, y4) = curve(root, "train-loss")
    assert (labels["1"][0], labels["4"][0]) == pytest.approx((x1, x4))  # centred under x ticks
    assert (labels["10"][1], labels["40"][1]) == pytest.approx((y1 + 4, y4 + 4))  # beside y ticks


def test_single_point_and_constant_values_draw_without_dividing_by_zero():
    svg = plot_svg([train(1, 2.0)], "one")
    root = ET.fromstring(svg)
    assert len(curve(root, "train-loss")) == 1
    assert len(markers(root, "train-loss")) == 1  # a lone polyline point would be invisible
    assert "nan" not in svg.lower() and "inf" not in svg.lower()
    constant = ET.fromstring(plot_svg([train(s, 2.0, samples_per_s=5.0) for s in (1, 2, 3)], "c"))
    ys = {y for _, y in curve(constant, "train-loss")}
    assert len(ys) == 1 and 70 < ys.pop() < 270  # inside the loss panel


def test_a_run_with_no_finite_loss_says_so():
    root = ET.fromstring(plot_svg([train(1, math.nan)], "empty"))
    assert "no finite values" in texts(root)
    assert not [e for e in root.iter(f"{SVG}polyline") if e.get("class") == "train-loss"]


def test_tokens_per_second_when_every_step_has_it():
    tokens = [train(s, 1.0, tokens_per_s=1000.0 * s) for s in (1, 2, 3)]
    root = ET.fromstring(plot_svg(tokens, "t"))
    assert "tokens/s" in texts(root) and "samples/s" not in texts(root)
    ys = [y for _, y in curve(root, "throughput")]
    assert ys[0] > ys[1] > ys[2]
    mixed = [*tokens, train(4, 1.0)]  # one record without tokens: fall back to samples/s
    assert "samples/s" in texts(ET.fromstring(plot_svg(mixed, "m")))


def test_title_is_escaped_and_output_is_deterministic():
    title = 'runs/<a & "b">'
    svg = plot_svg(last_run(two_runs()), title)
    root = ET.fromstring(svg)
    assert root.find(f"{SVG}title").text == title
    assert svg == plot_svg(last_run(two_runs()), title)
    assert root.get("width") == "900" and root.get("height") == "600"


def test_last_run_without_a_start_keeps_everything():
    records = [train(1, 1.0), train(2, 1.0)]
    assert last_run(records) == records
    assert last_run([train(1, 1.0), start(), train(2, 1.0)]) == [train(2, 1.0)]


@pytest.mark.parametrize(
    ("lo", "hi", "ticks"),
    [
        (0.0, 4.2, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
        (3.1, 4.2, [3.0, 3.5, 4.0, 4.5]),
        (1.0, 100.0, [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]),
        (2.0, 2.0, [1.8, 1.9, 2.0, 2.1, 2.2]),
    ],
)
def test_nice_ticks(lo, hi, ticks):
    assert nice_ticks(lo, hi) == ticks


def test_step_ticks_are_whole_numbers():
    assert nice_ticks(1.0, 1.0, integer=True) == [0.0, 1.0, 2.0]


def test_a_damaged_line_is_named_by_file_and_line(tmp_path):
    path = write_lines(tmp_path / "metrics.jsonl", [start(), train(1, 1.0)])
    with path.open("a") as f:
        f.write('{"kind": "train", "step": 2, "lo\n')
    with pytest.raises(PipecompileError, match=r"metrics\.jsonl:3: .*not valid JSON.*remove"):
        read_metrics(path)
    path.write_text(json.dumps(train(1, 1.0)) + "\n\n[1, 2]\n")
    with pytest.raises(PipecompileError, match=r"metrics\.jsonl:3: .*list, not an object"):
        read_metrics(path)


def test_missing_metrics_say_run_writes_them(tmp_path):
    with pytest.raises(PipecompileError, match=r"out has no metrics yet.*`pipecompile run "):
        write_plot(tmp_path / "out")


def test_metrics_without_train_records_are_refused(tmp_path):
    path = write_lines(tmp_path / "metrics.jsonl", [start(), {"kind": "eval", "step": 1}])
    with pytest.raises(PipecompileError, match=r'no "train" records'):
        read_metrics(path)


def test_write_plot_replaces_the_default_picture_atomically(tmp_path, monkeypatch):
    write_lines(tmp_path / "metrics.jsonl", two_runs())
    old = f"{plot.SVG_MARK}\n<svg>an earlier plot</svg>"
    (tmp_path / "training.svg").write_text(old)
    replaced, real_replace = [], os.replace

    def spy(src, dst):
        assert Path(dst).read_text() == old  # the old picture stays whole until the swap
        replaced.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(plot.os, "replace", spy)
    written = write_plot(tmp_path)
    assert written == tmp_path / "training.svg"
    assert [(s.parent, d) for s, d in replaced] == [(tmp_path, written)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "training.svg"]
    assert len(curve(ET.fromstring(written.read_text()), "train-loss")) == 4


def test_write_plot_from_a_metrics_file_and_to_a_named_output(tmp_path):
    source = write_lines(tmp_path / "run3.jsonl", two_runs())
    assert write_plot(source) == tmp_path / "run3.svg"
    target = tmp_path / "pictures" / "loss.svg"
    assert write_plot(source, target) == target and target.read_text().startswith("<?xml")


def test_only_svg_is_written(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", two_runs())
    with pytest.raises(PipecompileError, match="only SVG is drawn; name a .svg file"):
        write_plot(tmp_path, tmp_path / "training.png")
    assert not (tmp_path / "training.png").exists()


def test_a_picture_plot_did_not_draw_is_never_replaced(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", two_runs())
    mine = tmp_path / "training.svg"
    mine.write_text("<svg>my drawing</svg>")
    for output in (None, mine):
        with pytest.raises(PipecompileError, match="pipecompile plot did not draw it"):
            write_plot(tmp_path, output)
    assert mine.read_text() == "<svg>my drawing</svg>"
    mine.unlink()
    assert write_plot(tmp_path) == mine and write_plot(tmp_path) == mine  # its own: replaced
    assert plot.SVG_MARK in mine.read_text()
