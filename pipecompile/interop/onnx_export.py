"""Export every stage of an emitted directory to ONNX: `stage_<j>.onnx` beside `stage_<j>.py`.

Each ONNX graph's inputs and outputs carry the stage's value names from the manifest, so the
stages chain by name (see ``pipecompile.interop.onnx_chain``). Shapes are the micro-batch shapes the
stage was compiled for (the manifest's ``input_values`` and ``edges``); stages are exported in
eval mode, for inference. Needs the ``onnx`` extra: ``pip install 'pipecompile[onnx]'``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipecompile.errors import EmitError
from pipecompile.files.names import stage_onnx
from pipecompile.interop.onnx_registry import shared_registry
from pipecompile.ir.records.manifest import Manifest, StageEntry, write_manifest
from pipecompile.runtime.load import load_stage, read_manifest

__all__ = ["OnnxExportError", "export_onnx"]


class OnnxExportError(EmitError):
    """A stage cannot be exported to ONNX (an op without an ONNX form, or a missing package)."""


def export_onnx(
    directory: str | Path, *, progress: Callable[[str], None] | None = None
) -> list[Path]:
    """Write ``stage_<j>.onnx`` for every stage of ``directory`` and list them in its manifest.

    All stages are exported to a scratch folder first; only when every one has passed
    ``onnx.checker.check_model`` are they moved in and ``stages[j].onnx`` recorded, so a
    failure leaves the directory as it was.

    Args:
        directory: a directory written by ``pipecompile MODEL --stages N -o DIR``.
        progress: called with one line per exported stage (the CLI prints it on stderr).

    Returns:
        The paths of the ONNX files, in stage order.

    Raises:
        OnnxExportError: onnx is not installed, or a stage does not export; names the stage
            and the op the exporter could not convert.

    Example:
        >>> export_onnx(Path("out/gpt"))  # doctest: +SKIP
        [PosixPath('out/gpt/stage_0.onnx'), PosixPath('out/gpt/stage_1.onnx')]
    """
    onnx = _import_onnx()
    directory = Path(directory)
    manifest = read_manifest(directory)
    specs = _value_specs(manifest)
    scratch = directory / f".onnx-tmp-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        with shared_registry():
            for j, entry in enumerate(manifest.stages):
                start = time.perf_counter()
                _export_stage(onnx, directory, j, entry, specs, scratch / stage_onnx(j))
                if progress is not None:
                    ms = (time.perf_counter() - start) * 1000
                    progress(f"  {'onnx ' + stage_onnx(j):<22} {ms:8.1f} ms")
        for j in range(len(manifest.stages)):
            os.replace(scratch / stage_onnx(j), directory / stage_onnx(j))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    stages = [dataclasses.replace(e, onnx=stage_onnx(j)) for j, e in enumerate(manifest.stages)]
    write_manifest(directory, dataclasses.replace(manifest, stages=tuple(stages)))
    return [directory / stage_onnx(j) for j in range(len(stages))]


def _value_specs(manifest: Manifest) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype per micro-batch of every model input and every cross-stage value.

    Raises:
        OnnxExportError: the manifest predates ``input_values`` (recompile the model).
    """
    if manifest.input_values is None:
        raise OnnxExportError(
            "the manifest has no input_values (the micro-batch shapes of the model inputs); "
            "recompile the model with this pipecompile, then export again"
        )
    specs = {}
    for value in [*manifest.input_values, *manifest.edges]:
        specs[value.value] = (value.shape, getattr(torch, value.dtype))
    return specs


def _import_onnx() -> Any:
    try:
        import onnx
        import onnxscript  # noqa: F401  (the dynamo-based exporter needs it)
    except ImportError as err:
        raise OnnxExportError(
            f"ONNX export needs the packages onnx and onnxscript ({err.name} is missing); "
            "install them with: pip install 'pipecompile[onnx]'"
        ) from None
    return onnx


class _Computed(nn.Module):
    """A stage without the outputs that merely return one of its inputs.

    The exporters rename or duplicate a graph input that is also a graph output, which breaks
    chaining by name; those outputs are re-attached to the input afterwards instead.
    """

    def __init__(self, stage: nn.Module, keep: list[int]) -> None:
        super().__init__()
        self.stage = stage
        self.keep = keep

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.stage(*args)
        return tuple(outputs[k] for k in self.keep)


def _export_stage(
    onnx: Any,
    directory: Path,
    j: int,
    entry: StageEntry,
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]],
    target: Path,
) -> None:
    inputs, outputs = list(entry.inputs), list(entry.outputs)
    missing = [name for name in inputs if name not in specs]
    if missing:
        raise OnnxExportError(
            f"stage {j} takes {missing}, which the manifest gives no shape for; recompile"
        )
    args = tuple(torch.zeros(specs[name][0], dtype=specs[name][1]) for name in inputs)
    keep = [k for k, name in enumerate(outputs) if name not in inputs]
    module = _Computed(load_stage(directory, entry, seed_ops=False).eval(), keep)
    # Exported under placeholder names, renamed afterwards: a stage input called `add` would
    # otherwise collide with the exporter's own name for an internal add node.
    names = {f"pipecompile_in_{k}": name for k, name in enumerate(inputs)}
    names |= {f"pipecompile_out_{k}": outputs[k] for k in keep}
    try:
        with _quiet_exporter():
            torch.onnx.export(
                module,
                args,
                str(target),
                input_names=list(names)[: len(inputs)],
                output_names=list(names)[len(inputs) :],
                dynamo=True,
                external_data=False,
                verbose=False,
            )
    except Exception as err:
        raise OnnxExportError(_failure_message(directory, j, entry, err)) from err
    model = onnx.load(str(target))
    _rename_values(model.graph, names)
    _attach_passthrough(model, outputs)
    _check_names(model, j, inputs, outputs)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as err:
        raise OnnxExportError(
            f"stage {j}: the exported ONNX graph fails onnx.checker: {err}"
        ) from None
    onnx.save(model, str(target))


def _rename_values(graph: Any, names: dict[str, str]) -> None:
    """Rename the graph's values by ``names``; an internal value already called one of the new
    names is renamed out of the way first, so every name stays assigned once."""
    used = _value_names(graph)
    clash = {}
    for new in names.values():
        if new in used and new not in names:
            k = 1
            while f"{new}_{k}" in used:
                k += 1
            clash[new] = f"{new}_{k}"
            used.add(clash[new])
    for mapping in (clash, names):
        for value in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]:
            value.name = mapping.get(value.name, value.name)
        for node in graph.node:
            node.input[:] = [mapping.get(v, v) for v in node.input]
            node.output[:] = [mapping.get(v, v) for v in node.output]


def _value_names(graph: Any) -> set[str]:
    names = {v.name for v in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
    return names


def _attach_passthrough(model: Any, outputs: list[str]) -> None:
    """Order the graph outputs as the manifest does, pass-through ones naming the input."""
    graph = model.graph
    infos = {v.name: v for v in [*graph.input, *graph.output]}
    ordered = [type(infos[name])() for name in outputs]
    for info, name in zip(ordered, outputs):
        info.CopyFrom(infos[name])
    del graph.output[:]
    graph.output.extend(ordered)


def _check_names(model: Any, j: int, inputs: list[str], outputs: list[str]) -> None:
    got_in = [v.name for v in model.graph.input]
    got_out = [v.name for v in model.graph.output]
    if got_in != inputs or got_out != outputs:
        raise OnnxExportError(
            f"stage {j}: the exported graph takes {got_in} and returns {got_out}, but the "
            f"manifest says {inputs} -> {outputs}; the exporter renamed a value"
        )


_OP = re.compile(r"op='([^']+)', overload='([^']+)'")


def _failure_message(directory: Path, j: int, entry: StageEntry, err: Exception) -> str:
    """Names the stage and, where the exporter says it, the op it could not convert."""
    text = str(err)
    found = _OP.search(text)
    if found:
        what = f"the op {found.group(1)}.{found.group(2)} has no ONNX conversion"
    else:
        what = f"{type(err).__name__}: {_summary_line(text)}"
    return (
        f"stage {j} ({directory / entry.file}) cannot be exported to ONNX: {what}. The "
        f"PyTorch stages in {directory} are complete and no ONNX file was written; for ONNX, "
        "change the model to avoid that op (PIPECOMPILE_DEBUG=1 shows the exporter's report)"
    )


def _summary_line(text: str) -> str:
    """The exporter's own one-line reason: the line after '## Exception summary', if any."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for k, line in enumerate(lines[:-1]):
        if line.startswith("## Exception summary"):
            return lines[k + 1]
    return lines[0] if lines else "no message"


_EXPORTER_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir")


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's warnings and log lines ('torchvision is not installed', the
    optimizer's 'Evaluation failed' while folding constants); errors still raise."""
    loggers = [logging.getLogger(name) for name in _EXPORTER_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
