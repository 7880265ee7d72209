"""`pipecompile plot`: the loss and throughput curves of a training run, drawn as an SVG picture.

Reads the JSON-lines metrics `pipecompile run` appends to ``OUT/metrics.jsonl`` and draws the
last run in it as plain SVG text (no plotting library): loss against step above, throughput
against step below. The same records always give the same bytes. The picture carries
pipecompile's marker (an XML comment), and only a marked picture is ever replaced.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from pipecompile.errors import EmitError, PipecompileError
from pipecompile.files.disk import writing
from pipecompile.files.names import METRICS, TRAINING_PICTURE
from pipecompile.files.owned import SVG_MARK, is_our_svg
from pipecompile.files.writable import check_file

__all__ = ["read_metrics", "last_run", "nice_ticks", "plot_svg", "write_plot"]

WIDTH, HEIGHT = 900, 600
LEFT, RIGHT = 90, 870  # the plotting area's x extent, shared by both panels
PANELS = ((70, 200), (350, 200))  # (top, height) of the loss panel and the throughput panel
COLOURS = {"train": "#1f77b4", "eval": "#d62728", "throughput": "#2ca02c"}


@dataclass(frozen=True)
class Series:
    """One curve: ``points`` are (step, value) pairs, all finite, in file order."""

    label: str
    name: str  # the SVG class, so a reader (or a test) can find the curve
    colour: str
    points: tuple[tuple[float, float], ...]
    dashed: bool = False  # eval loss: a marker at each point, joined by a dashed line


@dataclass(frozen=True)
class Axis:
    """A linear map from data values in [lo, hi] to pixels in [start, end]; hi > lo."""

    lo: float
    hi: float
    ticks: tuple[float, ...]
    start: float
    end: float

    def at(self, value: float) -> float:
        return self.start + (value - self.lo) / (self.hi - self.lo) * (self.end - self.start)


# ---------------------------------------------------------------- reading


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file, one JSON object a line (blank lines skipped).

    Raises:
        PipecompileError: the file is missing, a line is not a JSON object (named as
            ``file:line``), or no line is a "train" record.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise PipecompileError(
            f"{path.parent} has no metrics yet ({path} does not exist); "
            f"`pipecompile run {path.parent}` writes them as it trains"
        ) from None
    records = [_record(path, n, line) for n, line in enumerate(text.splitlines(), 1)]
    records = [r for r in records if r is not None]
    if not any(r.get("kind") == "train" for r in records):
        raise PipecompileError(
            f'{path} has no "train" records, so there is nothing to draw; '
            f"plot it again after `pipecompile run` has trained a step"
        )
    return records


def _record(path: Path, number: int, line: str) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _damaged(path, number, f"is not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise _damaged(path, number, f"holds a JSON {type(value).__name__}, not an object")
    return value


def _damaged(path: Path, number: int, what: str) -> PipecompileError:
    return PipecompileError(
        f"{path}:{number}: the line {what}; remove or repair this line "
        f"(a run killed while writing leaves a partial last line)"
    )


def last_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records after the last "start" record (all of them when no run started)."""
    starts = [i for i, r in enumerate(records) if r.get("kind") == "start"]
    return records[starts[-1] + 1 :] if starts else list(records)


def _number(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _points(records: Iterable[dict[str, Any]], key: str) -> tuple[tuple[float, float], ...]:
    pairs = ((_number(r, "step"), _number(r, key)) for r in records)
    return tuple((s, v) for s, v in pairs if s is not None and v is not None)


def loss_series(records: list[dict[str, Any]]) -> list[Series]:
    """Train loss (steps that were applied, finite losses) and eval loss."""
    train = [r for r in records if r.get("kind") == "train" and r.get("skipped") is not True]
    evals = [r for r in records if r.get("kind") == "eval"]
    return [
        Series("train loss", "train-loss", COLOURS["train"], _points(train, "loss")),
        Series("eval loss", "eval-loss", COLOURS["eval"], _points(evals, "loss"), dashed=True),
    ]


def throughput_series(records: list[dict[str, Any]]) -> Series:
    """Tokens/s when every train record has it, samples/s otherwise."""
    train = [r for r in records if r.get("kind") == "train"]
    key, label = "samples_per_s", "samples/s"
    if train and all(r.get("tokens_per_s") is not None for r in train):
        key, label = "tokens_per_s", "tokens/s"
    return Series(label, "throughput", COLOURS["throughput"], _points(train, key))


# ---------------------------------------------------------------- axes


def nice_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """About ``count`` round tick values (1, 2 or 5 times a power of ten apart) whose first
    and last enclose [lo, hi]; a zero-width range is widened first. ``integer`` keeps the
    spacing at least 1 (steps are whole numbers).

    >>> nice_ticks(0.0, 4.2)
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    """
    lo, hi = _widen(lo, hi)
    spacing = _nice_spacing((hi - lo) / count)
    if integer:
        spacing = max(spacing, 1.0)
    first = math.floor(lo / spacing + 1e-9)
    last = math.ceil(hi / spacing - 1e-9)
    return [float(f"{k * spacing:.12g}") for k in range(first, last + 1)]


def _widen(lo: float, hi: float) -> tuple[float, float]:
    if hi - lo > 1e-9 * max(abs(lo), abs(hi), 1.0):
        return lo, hi
    pad = abs(lo) * 0.1 or 1.0
    return lo - pad, hi + pad


def _nice_spacing(raw: float) -> float:
    power = 10.0 ** math.floor(math.log10(raw))
    for multiple in (1.0, 2.0, 5.0):
        if raw <= multiple * power * (1 + 1e-9):
            return multiple * power
    return 10.0 * power


def _axis(values: list[float], start: float, end: float, *, integer: bool = False) -> Axis:
    ticks = nice_ticks(min(values, default=0.0), max(values, default=1.0), integer=integer)
    return Axis(ticks[0], ticks[-1], tuple(ticks), start, end)


# ---------------------------------------------------------------- drawing


def plot_svg(records: list[dict[str, Any]], title: str) -> str:
    """An SVG document (900x600) of ``records``: loss against step above, throughput below.

    Non-finite losses and skipped steps are left out; a panel with no point says so.
    """
    loss, throughput = loss_series(records), throughput_series(records)
    (loss_top, loss_height), (speed_top, speed_height) = PANELS
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        SVG_MARK,
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f"<title>{_text(title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2:g}" y="30" text-anchor="middle" font-size="16">{_text(title)}</text>',
        *_panel("loss", loss, loss_top, loss_height, "loss"),
        *_panel("throughput", [throughput], speed_top, speed_height, throughput.label),
        "</svg>",
    ]
    return "\n".join(lines) + "\n"


def _panel(name: str, series: list[Series], top: float, height: float, ylabel: str) -> list[str]:
    points = [p for s in series for p in s.points]
    x = _axis([s for s, _ in points], LEFT, RIGHT, integer=True)
    y = _axis([v for _, v in points], top + height, top)
    body = [line for s in series for line in _curve(s, x, y)]
    if not points:
        body.append(_label((LEFT + RIGHT) / 2, top + height / 2, "no finite values", "middle"))
    return [
        f'<g class="panel {name}">',
        *_frame(x, y, ylabel),
        *body,
        *_legend([s for s in series if s.points], top),
        "</g>",
    ]


def _frame(x: Axis, y: Axis, ylabel: str) -> list[str]:
    """Grid lines, tick labels, the two axes and their titles."""
    bottom, top = y.start, y.end
    lines = []
    for tick in x.ticks:
        at = _n(x.at(tick))
        lines.append(_line(at, _n(top), at, _n(bottom), "#e5e5e5"))
        lines.append(_label(x.at(tick), bottom + 16, f"{tick + 0.0:g}", "middle"))
    for tick in y.ticks:
        at = _n(y.at(tick))
        lines.append(_line(_n(LEFT), at, _n(RIGHT), at, "#e5e5e5"))
        lines.append(_label(LEFT - 6, y.at(tick) + 4, f"{tick + 0.0:g}", "end"))
    lines.append(_line(_n(LEFT), _n(bottom), _n(RIGHT), _n(bottom), "black"))
    lines.append(_line(_n(LEFT), _n(top), _n(LEFT), _n(bottom), "black"))
    lines.append(_label((LEFT + RIGHT) / 2, bottom + 34, "step", "middle"))
    middle = _n((top + bottom) / 2)
    lines.append(
        f'<text x="24" y="{middle}" text-anchor="middle" '
        f'transform="rotate(-90 24 {middle})">{_text(ylabel)}</text>'
    )
    return lines


def _curve(series: Series, x: Axis, y: Axis) -> list[str]:
    """A polyline through the points; markers too when the series is dashed or one point."""
    coords = [(_n(x.at(s)), _n(y.at(v))) for s, v in series.points]
    if not coords:
        return []
    dash = ' stroke-dasharray="6 4"' if series.dashed else ""
    lines = [
        f'<polyline class="{series.name}" fill="none" stroke="{series.colour}" '
        f'stroke-width="1.5"{dash} points="{" ".join(f"{a},{b}" for a, b in coords)}"/>'
    ]
    if series.dashed or len(coords) == 1:
        lines += [
            f'<circle class="{series.name}-marker" cx="{a}" cy="{b}" r="3.5" '
            f'fill="{series.colour}"/>'
            for a, b in coords
        ]
    return lines


def _legend(series: list[Series], top: float) -> list[str]:
    """One swatch and label a series, in the panel's top right corner."""
    lines = []
    for i, s in enumerate(series):
        row = top + 14 + 18 * i
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        lines.append(
            f'<line x1="{RIGHT - 120}" y1="{_n(row - 4)}" x2="{RIGHT - 96}" y2="{_n(row - 4)}" '
            f'stroke="{s.colour}" stroke-width="2"{dash}/>'
        )
        lines.append(_label(RIGHT - 90, row, s.label, "start"))
    return [f'<g class="legend">{"".join(lines)}</g>'] if lines else []


def _line(x1: str, y1: str, x2: str, y2: str, colour: str) -> str:
    return f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}"/>'


def _label(x: float, y: float, text: str, anchor: str) -> str:
    return f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="{anchor}">{_text(text)}</text>'


def _n(value: float) -> str:
    """A coordinate with at most two decimals and no trailing zeros: 120, 87.5, 33.33."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _text(text: str) -> str:
    """``text`` escaped for XML, with characters XML cannot hold replaced by '?'."""
    kept = "".join(c if c >= " " or c in "\t\n" else "?" for c in text)
    return escape(kept, {'"': "&quot;"})


# ---------------------------------------------------------------- writing


def write_plot(source: Path, output: Path | None = None) -> Path:
    """Draw the last run of ``source``'s metrics and write the SVG atomically.

    Args:
        source: an output directory (its ``metrics.jsonl`` is read) or a metrics file.
        output: where to write; by default ``training.svg`` in the directory, or
            ``<stem>.svg`` next to a metrics file.

    Returns:
        The path written.

    Raises:
        PipecompileError: ``output`` is not a .svg file, or the metrics cannot be read.
        EmitError: ``output`` is a picture ``plot`` did not draw (never replaced), or cannot
            be written (named, with the reason).
    """
    source = Path(source)
    # A path that does not exist yet is a directory unless it is named like a metrics file.
    is_file = source.is_file() or (source.suffix == ".jsonl" and not source.is_dir())
    metrics = source if is_file else source / METRICS
    if output is None:
        output = source.with_suffix(".svg") if is_file else source / TRAINING_PICTURE
    if output.suffix.lower() != ".svg":
        raise PipecompileError(f"cannot write {output}: only SVG is drawn; name a .svg file")
    if output.is_file() and not is_our_svg(output):
        raise EmitError(
            f"plot -o {output}: the file exists and pipecompile plot did not draw it; it is "
            "never replaced: choose another -o, or move it away"
        )
    check_file(output, "the plot")
    svg = plot_svg(last_run(read_metrics(metrics)), f"training: {metrics.parent}")
    tmp = output.with_name(f".{output.name}.tmp")
    with writing("write the plot to", output):
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(svg, encoding="utf-8", errors="replace")
            os.replace(tmp, output)
        finally:
            tmp.unlink(missing_ok=True)
    return output
