"""The names of the files pipecompile writes, each spelled here once (docs/FORMAT.md).

An emitted directory holds ``MANIFEST``, ``PROGRAM``, per stage ``stage_file_name(j)``,
``stage_weights(j)`` and, once exported, ``stage_onnx(j)``; with a meta-device model also
``INIT`` and ``INIT_CONSTANTS``; with a Hugging Face model, its configs (``MODEL_CONFIGS``);
with ``--generate``, per stage ``decode_file(j)`` and ``prefill_file(j)``, and
``GENERATE_CONSTANTS`` where the decoding stages read tensors the model's state lacks;
and the pictures ``PICTURES``. ``run`` adds ``METRICS`` and
``plot`` adds ``TRAINING_PICTURE`` beside them. A train state directory (``run --save DIR``)
holds ``step_name(n)`` folders, each with ``STEP_META`` and per stage
``stage_weights(j)`` and ``stage_optimizer(j)``, and the pointer ``LATEST``.
"""

from __future__ import annotations

import re

__all__ = [
    "GENERATE_CONSTANTS",
    "decode_file",
    "prefill_file",
    "MANIFEST",
    "PROGRAM",
    "TAIL",
    "INIT",
    "INIT_CONSTANTS",
    "MODEL_CONFIGS",
    "METRICS",
    "TRAINING_PICTURE",
    "PICTURES",
    "EMITTED",
    "LATEST",
    "STEP_META",
    "stage_file_name",
    "stage_weights",
    "stage_onnx",
    "stage_optimizer",
    "step_name",
]

MANIFEST = "manifest.json"
PROGRAM = "program.txt"
TAIL = "tail.py"  # the batch-coupled tail, run once a step on the joined values
INIT = "init.json"  # the initialisation recipes of a meta-device model
INIT_CONSTANTS = "init_constants.safetensors"  # the real tensors those recipes copy
GENERATE_CONSTANTS = "generate_constants.safetensors"  # --generate: tensors no state holds
# A Hugging Face model's own configs, saved by the compile under these names (values); export
# writes each beside the weights under the name from_pretrained reads (keys).
MODEL_CONFIGS = {
    "config.json": "model_config.json",
    "generation_config.json": "model_generation_config.json",
}
METRICS = "metrics.jsonl"  # what `pipecompile run` writes in the emitted directory
TRAINING_PICTURE = "training.svg"  # what `pipecompile plot DIR` writes next to it
# Every picture `pipecompile viz` may draw into an emitted directory.
PICTURES = tuple(
    f"{name}.{ext}" for name in ("stages", "schedule") for ext in ("dot", "svg", "png", "pdf")
)
LATEST = "latest"  # a train state directory's pointer: one line naming the newest step
STEP_META = "meta.json"  # a saved step's record (its format marker, the step)


def stage_file_name(j: int) -> str:
    """``stage_<j>.py``: stage ``j`` as a standalone module."""
    return f"stage_{j}.py"


def decode_file(j: int) -> str:
    """``decode_stage_<j>.py``: stage ``j`` of the decoding step, one token a row."""
    return f"decode_stage_{j}.py"


def prefill_file(j: int) -> str:
    """``prefill_stage_<j>.py``: stage ``j`` of the prefill step, a prompt's tokens."""
    return f"prefill_stage_{j}.py"


def stage_weights(j: int) -> str:
    """``stage_<j>.safetensors``: stage ``j``'s tensors (emitted, and in a saved step)."""
    return f"stage_{j}.safetensors"


def stage_onnx(j: int) -> str:
    """``stage_<j>.onnx``: stage ``j``'s ONNX graph (``pipecompile onnx``)."""
    return f"stage_{j}.onnx"


def stage_optimizer(j: int) -> str:
    """``stage_<j>.optim.pt``: stage ``j``'s optimizer state in a saved step."""
    return f"stage_{j}.optim.pt"


def step_name(n: int) -> str:
    """``step_<n>``: the train state saved after training step ``n``."""
    return f"step_{n}"


# Every name a compile (or --onnx, or viz) may write into an emitted directory.
EMITTED = re.compile(
    r"stage_\d+\.(py|safetensors|onnx)|(decode|prefill)_stage_\d+\.py"
    + "".join(
        f"|{re.escape(name)}"
        for name in (
            PROGRAM,
            TAIL,
            INIT,
            INIT_CONSTANTS,
            MANIFEST,
            GENERATE_CONSTANTS,
            *MODEL_CONFIGS.values(),
        )
    )
)
