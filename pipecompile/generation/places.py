"""Where the decoding stages run (`generate --device`): on the host, or on the GPUs. In one
process stage j takes GPU j modulo the GPUs torch sees; with ranks, a rank takes its local
index's GPU modulo the same count, so ranks share GPUs only where there are fewer GPUs than
ranks on the machine. Two ends on different GPUs pass hidden states by NCCL; ends that share a
GPU, or where one is the host, pass them through host memory (NCCL refuses two ranks on one
GPU): each end says where it runs (``identity``) before the wire forms."""

from __future__ import annotations

import socket

import torch

from pipecompile.errors import PipecompileError
from pipecompile.generation.step_trace import GenerateError
from pipecompile.runtime.job.gpus import device_kind

__all__ = ["generation_device", "stage_device", "identity", "CPU"]

CPU = "cpu"  # the identity of an end on the host


def generation_device(choice: str | None, local_ranks: int, gpus: int | None = None) -> str:
    """``"cpu"`` or ``"cuda"`` for ``--device choice`` (None: auto) with ``local_ranks``
    ranks on this machine (1: one process): auto takes the GPUs when each rank gets one of
    its own, cuda takes them whatever their count.

    Raises:
        GenerateError: cuda, but torch sees no GPU.
    """
    try:
        return device_kind(choice or "auto", local_ranks, gpus, share=True)
    except PipecompileError as err:  # said as generation's own
        raise GenerateError(str(err)) from None


def stage_device(kind: str, index: int) -> torch.device:
    """The device of stage or local rank ``index`` for a generation on ``kind``."""
    if kind == CPU:
        return torch.device(CPU)
    return torch.device("cuda", index % torch.cuda.device_count())


def identity(device: torch.device) -> str:
    """Which physical device ``device`` is, the same in every process that sees it: the
    host, or the machine's name and the GPU's UUID."""
    if device.type != "cuda":
        return CPU
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return f"{socket.gethostname()}/{uuid if uuid is not None else device.index}"
