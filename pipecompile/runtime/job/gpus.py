"""Which kind of device the ranks of `run --nproc` use: cpu (gloo) or a GPU each (NCCL).

NCCL refuses two ranks on one GPU, so `cuda` needs a GPU per rank of the machine; `auto`
takes the GPUs only when there are enough of them, and the CPU otherwise.
"""

from __future__ import annotations

import torch

from pipecompile.errors import PipecompileError

__all__ = ["device_kind"]


def device_kind(
    choice: str, local_ranks: int, gpus: int | None = None, *, share: bool = False
) -> str:
    """``"cpu"`` or ``"cuda"`` for ``--device choice`` with ``local_ranks`` ranks on this
    machine and ``gpus`` GPUs (default: the ones torch sees). ``share``: ranks may share a
    GPU (generation's, which then passes their tensors through host memory, not NCCL).

    Raises PipecompileError for ``cuda`` without a GPU, or (unless ``share``) with too few,
    naming both counts."""
    if choice == "cpu":
        return "cpu"
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice == "auto":
        return "cuda" if gpus >= local_ranks > 0 else "cpu"
    if gpus == 0:
        raise PipecompileError("--device cuda, but torch sees no CUDA device: use --device cpu")
    if gpus < local_ranks and not share:
        raise PipecompileError(
            f"--device cuda puts each rank on a GPU of its own (NCCL refuses two ranks on one "
            f"GPU), but this machine has {local_ranks} ranks and torch sees {gpus} GPU"
            f"{'s' if gpus != 1 else ''}: run on {local_ranks} GPUs, compile for at most {gpus} "
            f"devices (`--virtual-stages` puts several stages on one), or use --device cpu"
        )
    return "cuda"
