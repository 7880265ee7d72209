"""Which files of an output directory pipecompile owns, and replacing them without losing any
other file.

A directory is pipecompile's only if its ``manifest.json`` parses and carries pipecompile's
format marker; even then, pipecompile owns only the files that manifest names (stage sources,
weights, ONNX graphs, the program, the model's configs, the manifest) and the pictures.
Anything else in the directory is the user's: a compile refuses to replace a directory holding
such files, and with ``force`` writes its own files beside them, never deleting or replacing
one it did not write (a user's file named as one pipecompile writes, such as ``stage_0.py``, is
refused). What `run` and `plot` write there (``RUN_RECORDS``) is pipecompile's too, but it is
the history of training runs, not part of the compiled model: a recompile carries it over.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from pipecompile.errors import EmitError, PipecompileError
from pipecompile.files.names import (
    EMITTED,
    GENERATE_CONSTANTS,
    MANIFEST,
    METRICS,
    PICTURES,
    TRAINING_PICTURE,
)
from pipecompile.ir.records.manifest import Manifest, read_manifest

__all__ = [
    "RUN_RECORDS",
    "owned_names",
    "read_own_manifest",
    "check_replaceable",
    "kept_note",
    "new_temp_dir",
    "replace_output",
]

RUN_RECORDS = (METRICS, TRAINING_PICTURE)  # run's metrics and plot's picture


def read_own_manifest(directory: Path) -> Manifest | None:
    """The manifest of ``directory`` if pipecompile wrote it (in this format), else None."""
    try:
        return read_manifest(directory)
    except PipecompileError:
        return None


def owned_names(manifest: Manifest) -> set[str]:
    """The names of the files an emitted directory's manifest says pipecompile wrote."""
    names = {MANIFEST, *PICTURES, manifest.program}
    if manifest.weights is not None:
        names.update(n for n in (manifest.weights.init, manifest.weights.init_constants) if n)
    for stage in manifest.stages:
        names.update(n for n in (stage.file, stage.weights, stage.onnx) if n)
    if manifest.model is not None and manifest.model.configs:
        names.update(manifest.model.configs.values())
    if isinstance(manifest.generate, dict):  # --generate's stage files and constants
        for stage in manifest.generate.get("stages") or []:
            if isinstance(stage, dict):
                names.update(str(stage[k]) for k in ("decode", "prefill") if k in stage)
        names.add(GENERATE_CONSTANTS)
    return names


def check_replaceable(out: Path, *, force: bool = False) -> list[str]:
    """Refuse to write an output into ``out`` where that could lose a user's file.

    Returns the names in ``out`` that pipecompile did not write (empty unless ``force``).

    Raises:
        EmitError: ``out`` is a file or cannot be created; it holds files pipecompile did
            not write (named in the message) and ``force`` is not set; or, ``force`` or not,
            one of them bears a name pipecompile writes (it would be replaced).
    """
    out = Path(out)
    try:
        if out.exists() and not out.is_dir():
            raise EmitError(f"output {str(out)!r} is a file; pass a directory with -o")
        present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    except OSError as err:
        raise EmitError(f"cannot use output directory {str(out)!r}: {_reason(err)}") from None
    if not present:
        _probe(out, inside=False)
        return []
    manifest = read_own_manifest(out)
    ours = owned_names(manifest) | set(RUN_RECORDS) if manifest is not None else set()
    foreign = [n for n in present if n not in ours]
    clash = [n for n in foreign if EMITTED.fullmatch(n) or n in PICTURES]
    what = "is not a pipecompile output; it holds" if manifest is None else "holds"
    if clash:
        raise EmitError(
            f"output directory {str(out)!r} {what} files pipecompile did not write "
            f"({_shown(out, foreign)}), {_shown(out, clash)} among them under a name it may "
            "write; it never replaces them (--force or not): choose another -o, or move them out"
        )
    if foreign and not force:
        raise EmitError(
            f"output directory {str(out)!r} {what} files pipecompile did not write "
            f"({_shown(out, foreign)}); choose another -o, move them out, or pass --force to "
            "write beside them (nothing of theirs is deleted)"
        )
    _probe(out, inside=bool(foreign))
    return foreign


def _probe(out: Path, *, inside: bool) -> None:
    """Refuse now, before the work, an ``out`` whose parent (where the new output is built)
    or, with ``inside``, which itself (where it is merged) cannot be written."""
    shutil.rmtree(new_temp_dir(out))
    if inside:
        try:
            probe = out / f".pipecompile-probe-{uuid.uuid4().hex[:12]}"
            probe.mkdir()
            probe.rmdir()
        except OSError as err:
            raise EmitError(f"cannot write output directory {str(out)!r}: {_reason(err)}") from None


def kept_note(out: Path, keep: list[str]) -> str:
    """The note a compile with ``force`` prints about the user's files it left in ``out``."""
    return f"kept {_shown(out, keep)} in {out}: pipecompile did not write them"


def _shown(out: Path, names: list[str]) -> str:
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(_label(out, n) for n in names[:5]) + more


def _label(out: Path, name: str) -> str:
    return f"{name}/" if (out / name).is_dir() else name


def new_temp_dir(out: Path) -> Path:
    """A fresh hidden directory beside ``out`` to build an output in (its name has a fixed
    length, so a long ``out`` name never makes it too long)."""
    out = Path(out)
    tmp = out.parent / f".pipecompile-tmp-{uuid.uuid4().hex[:12]}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as err:  # not named: the temporary directory's name says nothing
        bare = OSError(err.errno, err.strerror) if err.filename == str(tmp) else err
        raise EmitError(f"cannot create output directory {str(out)!r}: {_reason(bare)}") from None
    return tmp


def replace_output(tmp: Path, out: Path, *, keep: list[str]) -> None:
    """Put the finished directory ``tmp`` at ``out``.

    Without ``keep`` the whole directory is swapped: a previous ``out`` is renamed aside and
    removed only once the new one is in place. With ``keep`` (the user's files, see
    ``check_replaceable``) each new file is moved into ``out`` and only files the previous
    manifest names are removed; ``keep`` stays as it is.
    """
    tmp, out = Path(tmp), Path(out)
    try:
        if keep:
            _merge_into(tmp, out, keep)
        elif not out.exists():
            tmp.rename(out)
        else:
            for name in RUN_RECORDS:  # the runs' history outlives the compiled stages
                if (out / name).is_file() and not (tmp / name).exists():
                    os.replace(out / name, tmp / name)
            old = out.parent / f".pipecompile-old-{uuid.uuid4().hex[:12]}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
    except OSError as err:
        raise EmitError(f"cannot write output directory {str(out)!r}: {_reason(err)}") from None


def _merge_into(tmp: Path, out: Path, keep: list[str]) -> None:
    previous = read_own_manifest(out)
    stale = owned_names(previous) if previous else set()
    new = {p.name for p in tmp.iterdir()}
    taken = sorted(new & set(keep))
    if taken:  # check_replaceable refuses these; never replace a user's file regardless
        raise EmitError(
            f"output directory {str(out)!r} holds {', '.join(taken)}, which "
            "pipecompile did not write; choose another -o"
        )
    for name in sorted(stale - new - set(keep)):
        path = out / name
        if path.is_file():
            path.unlink()
    for name in sorted(new - {MANIFEST}):
        os.replace(tmp / name, out / name)
    os.replace(tmp / MANIFEST, out / MANIFEST)  # last: the directory reads as complete
    tmp.rmdir()


def _reason(err: OSError) -> str:
    if err.errno == 36:  # ENAMETOOLONG
        return "a file name is too long; choose a shorter -o"
    return f"{err.strerror or err}" + (f" ({err.filename})" if err.filename else "")
