"""`pipecompile export OUT -o FILE.safetensors`: the pipeline's weights under the original
model's names, one safetensors state dict that ``model.load_state_dict`` accepts."""

from __future__ import annotations

import os
from pathlib import Path

from safetensors.torch import save_file

from pipecompile.runtime.checkpoint import resume
from pipecompile.runtime.pipeline import Pipeline

__all__ = ["export_weights"]


def export_weights(directory: Path, target: Path, checkpoint: Path | None = None) -> int:
    """Write the emitted (or the checkpoint's newest) weights to ``target`` atomically;
    returns the number of tensors. Tied parameters appear under each of their names."""
    pipe = Pipeline.load(directory)
    if checkpoint is not None:
        resume(pipe, checkpoint)
    state = {name: t.detach().clone().contiguous() for name, t in pipe.state_dict().items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    save_file(state, str(tmp))
    os.replace(tmp, target)
    return len(state)
