"""Run exported ONNX stages one after another in onnxruntime: pipeline-split inference.

Mirrors ``tests/standalone_chain.py``: stage ``j`` is fed its inputs by name from the model
inputs and the earlier stages' outputs; the last stage's outputs are the model's, in the
manifest's ``outputs`` order. One micro-batch per call (the graphs have its static shapes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipecompile.errors import EmitError, RuntimeFailure
from pipecompile.ir.records.manifest import StageEntry
from pipecompile.runtime.load import read_manifest

__all__ = ["run_onnx_chain"]


def run_onnx_chain(
    directory: str | Path,
    inputs: Mapping[str, np.ndarray | torch.Tensor],
    *,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> list[np.ndarray]:
    """The model's flat outputs for one micro-batch, computed by the stages' ONNX graphs.

    Args:
        directory: an emitted directory whose stages were exported (``--onnx``).
        inputs: every model input by name, with the micro-batch shapes of the manifest's
            ``input_values``; tensors are converted to NumPy.
        providers: onnxruntime execution providers, in order of preference.

    Returns:
        One array per name in the manifest's ``outputs``.

    Raises:
        EmitError: onnxruntime is missing, or a stage has no ONNX file.
        RuntimeFailure: an input is missing, or onnxruntime fails on a stage (names it).

    Example:
        >>> run_onnx_chain(Path("out/gpt"), {"idx": torch.zeros(4, 16, dtype=torch.long)})
        ... # doctest: +SKIP
        [array([[[...]]], dtype=float32)]
    """
    ort = _import_onnxruntime()
    directory = Path(directory)
    manifest = read_manifest(directory)
    missing = [name for name in manifest.inputs if name not in inputs]
    if missing:
        raise RuntimeFailure(f"run_onnx_chain: model inputs {missing} are missing")
    values = {name: _as_numpy(inputs[name]) for name in manifest.inputs}
    for j, entry in enumerate(manifest.stages):
        session = _session(ort, directory, j, entry, providers)
        feed = {name: values[name] for name in entry.inputs}
        try:
            outputs = session.run(list(entry.outputs), feed)
        except Exception as err:
            shapes = {name: list(array.shape) for name, array in feed.items()}
            raise RuntimeFailure(
                f"stage {j} ({entry.onnx}) failed in onnxruntime with inputs {shapes}: "
                f"{err}; the graphs take one micro-batch of the compiled shapes"
            ) from None
        values.update(zip(entry.outputs, outputs))
    return [values[name] for name in manifest.outputs]


def _session(ort: Any, directory: Path, j: int, entry: StageEntry, providers: Sequence[str]) -> Any:
    if entry.onnx is None:
        raise EmitError(
            f"stage {j} of {directory} has no ONNX file; export it with "
            f"`pipecompile onnx {directory}` (or compile with --onnx)"
        )
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(str(directory / entry.onnx), options, providers=list(providers))


def _as_numpy(value: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().numpy()
    return np.ascontiguousarray(value)


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime  # type: ignore[import-untyped]
    except ImportError:
        raise EmitError(
            "running ONNX stages needs onnxruntime: pip install 'pipecompile[onnx]'"
        ) from None
    return onnxruntime
