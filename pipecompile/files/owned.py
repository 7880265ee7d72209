"""Did pipecompile write this file? One marker per kind of file it writes outside an emitted
directory; only a file carrying its marker is ever replaced or deleted.

* an exported ``.safetensors`` file or shard: ``written_by`` in its safetensors metadata;
* an export's ``model.safetensors.index.json``: ``written_by`` in its ``metadata``, with the
  sha256 of each file the export copied beside it (``config.json``) under ``copied``;
* a ``pipecompile plot`` SVG: the XML comment ``SVG_MARK`` near its start (or, drawn before
  the marker existed, plot's exact opening lines);
* a metrics file: every complete line a JSON object with ``kind`` and ``time``;
* a saved step of a train state directory: ``meta.json`` with ``TRAIN_STATE_FORMAT``;
  ``latest``: a line naming ``step_<n>``;
* a file of a kind that carries no marker (``viz``'s pictures written outside an emitted
  directory: DOT, SVG, PNG, PDF): its sha256 in the ledger ``LEDGER`` beside it, so a file
  changed since pipecompile wrote it is no longer pipecompile's.

An emitted directory's ownership (its manifest) is ``codegen.output_dir``'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pipecompile.files.atomic import write_atomically
from pipecompile.files.names import STEP_META

__all__ = [
    "EXPORT_MARK",
    "EXPORT_METADATA",
    "SVG_MARK",
    "TRAIN_STATE_FORMAT",
    "SHARD",
    "is_our_safetensors",
    "is_our_index",
    "copied_digests",
    "is_our_svg",
    "is_our_metrics",
    "is_our_step_dir",
    "is_our_latest",
    "sha256",
    "LEDGER",
    "unrecorded",
    "record",
]

EXPORT_MARK = "pipecompile export"
EXPORT_METADATA = {"format": "pt", "written_by": EXPORT_MARK}  # safetensors header metadata
SVG_MARK = "<!-- written by pipecompile plot -->"
# What plot's pictures began with before they carried SVG_MARK (byte for byte).
_OLD_SVG = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" '
    b'width="900" height="600" viewBox="0 0 900 600" font-family="sans-serif" '
    b'font-size="12">\n<title>training: '
)
TRAIN_STATE_FORMAT = "pipecompile-checkpoint/1"  # the on-disk marker keeps its old word
LEDGER = ".pipecompile-written.json"  # name -> sha256 of files written without a marker
SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")  # a Hugging Face shard's name

_HEAD = 4096  # bytes read to find an SVG's marker
_METRICS_HEAD = 1 << 20  # bytes of a metrics file whose lines are checked


def is_our_safetensors(path: Path) -> bool:
    """Whether ``path`` is a safetensors file pipecompile export wrote."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size < 100_000_000:
                return False
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return False
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(meta, dict) and meta.get("written_by") == EXPORT_MARK


def is_our_index(path: Path) -> bool:
    """Whether ``path`` is a ``model.safetensors.index.json`` pipecompile export wrote."""
    return _index_metadata(path).get("written_by") == EXPORT_MARK


def copied_digests(index: Path) -> dict[str, str]:
    """name -> sha256 of the files an export copied beside its index (none if not ours)."""
    meta = _index_metadata(index)
    copied = meta.get("copied") if meta.get("written_by") == EXPORT_MARK else None
    return {k: v for k, v in (copied or {}).items() if isinstance(v, str)}


def _index_metadata(path: Path) -> dict[str, Any]:
    try:
        index = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    meta = index.get("metadata") if isinstance(index, dict) else None
    return meta if isinstance(meta, dict) else {}


def is_our_svg(path: Path) -> bool:
    """Whether ``path`` is a picture ``pipecompile plot`` drew."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
    except OSError:
        return False
    return SVG_MARK.encode() in head or head.startswith(_OLD_SVG)


def is_our_metrics(path: Path) -> bool:
    """Whether ``path`` is empty or holds only records `pipecompile run` appended (a last
    line cut short by a killed run aside), so that more may be appended to it."""
    try:
        with open(path, "rb") as f:
            data = f.read(_METRICS_HEAD)
    except OSError:
        return False
    seen = False
    for line in data.split(b"\n")[:-1]:  # the last is empty, or a line cut short
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            return False
        if not isinstance(record, dict) or "kind" not in record or "time" not in record:
            return False
        seen = True
    return seen or not data.strip()


def is_our_step_dir(path: Path) -> bool:
    """Whether ``path`` is a saved step (train state) directory pipecompile wrote."""
    try:
        meta = json.loads((Path(path) / STEP_META).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == TRAIN_STATE_FORMAT


def is_our_latest(path: Path) -> bool:
    """Whether ``path`` is a train state directory's ``latest`` pointer."""
    try:
        text = Path(path).read_text()
    except (OSError, ValueError):
        return False
    return re.fullmatch(r"step_\d+\n?", text) is not None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unrecorded(paths: list[Path]) -> list[Path]:
    """The existing files among ``paths`` that their directory's ledger does not record with
    their current content (a user's file, or one changed since pipecompile wrote it)."""
    return [p for p in paths if p.exists() and _ledger(p.parent).get(p.name) != _digest(p)]


def record(paths: list[Path]) -> None:
    """Add the written ``paths`` (all in one directory) to that directory's ledger."""
    if not paths:
        return
    directory = paths[0].parent
    ledger = _ledger(directory)
    ledger.update({p.name: sha256(p) for p in paths})
    write_atomically(directory / LEDGER, json.dumps(dict(sorted(ledger.items())), indent=1) + "\n")


def _ledger(directory: Path) -> dict[str, str]:
    try:
        ledger = json.loads((Path(directory) / LEDGER).read_text())
    except (OSError, ValueError):
        return {}
    return (
        {k: v for k, v in ledger.items() if isinstance(v, str)} if isinstance(ledger, dict) else {}
    )


def _digest(path: Path) -> str | None:
    try:
        return sha256(path) if path.is_file() else None
    except OSError:
        return None
